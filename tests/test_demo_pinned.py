"""`make demo`'s decision sequence and figures at seed 0, pinned: a refactor of the loop, the executor or the
store that changes what the demo decides (or the figures it decides on) fails here. A deliberate change of
the planner updates this pin in the same commit, saying why."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from state.kpis import compute_kpis
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]
TUNELOOP = Path(sys.executable).with_name("tuneloop")

PINNED = [
    # the start is measured at confirm N: the moves that skip their screen compare there, and no screen-N
    # reference is spent before a screen needs one
    ("baseline", False, "baseline N=640: measure the parent station: reference at N=640"),
    # a supported hypothesis (confidence >= 0.6) skips its screen: a screen would more likely pass than not
    ("new_best", True, "confirm N=640: max_prefill_reqs 1 -> 2: confirmed +32.07% native vs parent at N=640: "
                       "new best station"),
    ("promising", False, "confirm N=640: max_num_batched_tokens 8192 -> 16384: confirmed +42.39% whole vs parent "
                         "at N=640, but no valid native window at N=640 (the objective's window): not the best "
                         "until a run of it gives one"),
    ("new_best", True, "confirm N=640: request_rate 6.0 -> 8.0: confirmed +46.83% native vs the best station "
                       "(the parent has no native window) at N=640: new best station"),
    # the screen below compares with it (a reference only where a comparison needs it)
    ("baseline", False, "baseline N=320: measure the parent station: reference at N=320"),
    ("negative", True, "screen N=320: concurrency 128 -> 160: screen +0.00% whole vs parent at N=320 (no gain "
                       "beyond noise); closes client_supply"),
    ("promising", False, "screen N=320: concurrency 128 -> 64: screen -8.13% whole vs parent at N=320 with lower "
                         "TTFT, TPOT and E2E: confirm as a trade-off"),
    ("tradeoff", True, "confirm N=640: concurrency 128 -> 64: confirmed -10.94% native vs parent at N=640 with "
                       "lower TTFT, TPOT and E2E: a trade-off on the frontier"),
    ("stop", False, "experiment budget spent"),
]


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory) -> Store:
    cwd = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    proc = subprocess.run([str(TUNELOOP), "demo"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "report:" in proc.stdout
    store = Store(f"sqlite:///{cwd / '.tuneloop' / 'demo' / 'tuneloop.db'}")
    store.demo = (cwd, env, proc.stdout)  # type: ignore[attr-defined]
    yield store
    store.close()


def test_the_restore_command_the_demo_prints_works_as_printed(demo_store: Store):
    """The demo's summary names the best station and a `tuneloop restore` command: pasted in the directory the
    demo ran in (a shell, the environment it had), it brings that station back healthy and identical."""
    import json
    import re

    cwd, env, out = demo_store.demo  # type: ignore[attr-defined]
    m = re.search(r"best station ([0-9a-f]{16}): restore with `(tuneloop restore [^`]+)`", out)
    assert m, out[-2000:]
    env = env | {"PATH": f"{TUNELOOP.parent}{os.pathsep}{env.get('PATH', '')}"}
    proc = subprocess.run(m.group(2), shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["station"] == m.group(1) and got["healthy"] and got["identical"], got


def test_demo_decides_as_pinned(demo_store: Store):
    (goal,) = demo_store.goals()
    got = [(d.kind, d.changed, d.text) for d in demo_store.decisions(goal.id)]
    assert got == PINNED


def test_demo_kpis_half_the_experiments_change_a_decision(demo_store: Store):
    (goal,) = demo_store.goals()
    k = compute_kpis(demo_store, goal.id)
    assert k.experiments == 8 and k.decision_changing_share >= 0.5
    assert k.repeated_negatives == 0 and k.invalid_negatives == 0


def test_demo_best_station_and_spend_as_pinned(demo_store: Store):
    (goal,) = demo_store.goals()
    best = demo_store.best(goal.id)
    fig = best.data["figures"]
    assert best.data["knobs"]["max_prefill_reqs"] == 2
    assert best.data["knobs"]["max_num_batched_tokens"] == 16384
    assert best.data["knobs"]["request_rate"] == 8.0
    assert (fig["n"], fig["native_n"]) == (640, 463)
    assert fig["native"] == pytest.approx(347.8223, abs=1e-3)
    assert fig["tpot_mean"] == pytest.approx(11.1187, abs=1e-3)
    assert demo_store.card_hours_used(goal.id) == pytest.approx(15.0282, abs=1e-3)
