"""Every fault the simulator injects, on the `local` target: a real `tuneloop sim serve` process
started through the launcher and the real load generator. Each ends in the right verdict, and the
run after it resumes correctly (a faulty service is never reused, a collection is redone from the
raw data without a second load)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
import sys

import httpx
import pytest
from ports_support import free_port

from core.journal import as_record
from core.trial import TrialSpec
from executor.collect import STATS_FAULT
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Target
from executor.transports.local import LocalTransport
from state.store import Store

COPY = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 32\nseed: 7\n"
SHARED = ("name: tiny-shared\nversion: 1\ntask: chat\ninput_len: 256\noutput_len: 16\nprefix_share: 0.5\n"
          "prefix_groups: 2\nmin_request_hit: 0.4\nseed: 7\n")
N = 16


class StatsFailsOnce(LocalTransport):
    """A test transport: the first fetch of a listed load leaves the statistics-failure marker beside the raw
    records, as a statistics step that crashed after the load would (fault injection stays out of the executor)."""

    keys: set[str] = {"sf.load"}

    async def fetch(self, key, dest):
        out = await super().fetch(key, dest)
        if key in self.keys:
            self.keys.discard(key)
            (dest / STATS_FAULT).write_text("injected\n")
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "copy.yaml").write_text(COPY)
    (tmp / "shared.yaml").write_text(SHARED)
    port = free_port()
    target = Target(name="loc", kind="local", engine="sim", run_root=str(tmp / "tgt"), time_scale=100.0,
                    tuneloop=(sys.executable, "-m", "tuneloop_cli"),
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=16, port=port),))
    ex = Executor(Store(f"sqlite:///{tmp / 'state.db'}"), {"loc": target},
                  ExecSettings(runs_root=tmp / "runs", holder="faults:local", poll_interval_s=0.05,
                               timeouts_s={"health": 30.0, "load": 120.0}),  # a start on two busy cores
                  transports=lambda target, root: StatsFailsOnce(target))
    yield ex, tmp, port
    from executor.templates import ServiceSpec

    svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("true",))
    asyncio.run(LocalTransport(target).stop_service(svc, 10**9))


def _run(ex: Executor, tmp, run_id: str, faults: list[str], scenario: str = "copy", warmup: int = 0):
    return ex.run_trial(TrialSpec(run_id=run_id, goal_id="g", target="loc", scenario=str(tmp / f"{scenario}.yaml"),
                                  n=N, warmup=warmup, seed=1, faults=faults,
                                  knobs={"concurrency": 4, "request_rate": "inf"}))


def _journal(ex: Executor, run_id: str):
    return [as_record(r) for r in ex.store.phases(run_id)]


def _served_or_zero(port: int) -> int:
    try:
        return _served(port)
    except httpx.HTTPError:
        return 0


def _restarted(ex: Executor, run_id: str) -> bool:
    return any(r.phase == "deploy" and r.event == "outcome" and (r.detail or {}).get("restarted")
               for r in _journal(ex, run_id))


def _log(tmp) -> str:
    return (tmp / "tgt" / "launch.log").read_text()


def _served(port: int) -> int:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return int(float(next(x.split()[1] for x in text.splitlines() if x.startswith("tuneloop_sim_requests_total"))))


def test_launch_failure_is_an_orchestration_fault_and_nothing_is_sent(world):
    ex, tmp, _ = world
    r = _run(ex, tmp, "lf", ["launch_failure"])
    assert r.verdict.kind == "orchestration_fault" and r.summary is None and r.failed_phase == "health"
    assert "launch failed" in r.error  # the server's own error text comes back
    out = [x for x in _journal(ex, "lf") if x.phase == "health" and x.event == "outcome"]
    assert [(x.status, x.error_class) for x in out] == [("failed", "launch_failure")]
    assert "start-run lf.load" not in _log(tmp) and not r.healthy_after


def test_never_healthy_is_an_orchestration_fault(world):
    ex, tmp, _ = world
    # a service that never answers its health check is waited on for the whole health timeout: the module's 30 s,
    # since the message must name what answered, the server has to be up and answering 503 before it runs out (6 s
    # was too short for a Python server to start beside a real vLLM on two cores: CI saw only refused connections)
    r = _run(ex, tmp, "nh", ["never_healthy"])
    assert r.verdict.kind == "orchestration_fault" and r.verdict.reasons[0].code == "never_healthy"
    assert "(last probe: HTTP 503" in r.verdict.reasons[0].message  # what answered, for the engineer reading it
    assert "start-run nh.load" not in _log(tmp)


def test_crash_mid_run_is_not_valid_and_the_next_run_restarts(world):
    ex, tmp, port = world
    r = _run(ex, tmp, "cr", ["crash_at=0.5"])
    # a server that dies mid-run is a tooling fault (as the sim target's crash: formal requests never served)
    assert r.verdict.kind == "orchestration_fault" and not r.healthy_after, (r.verdict, r.error)
    assert r.verdict.reasons[0].code == "server_died" and "simulated crash after 8 requests" in r.error
    assert r.failed_phase == "load" and r.summary.n_failed >= N // 2  # requests after the crash all failed
    # the engine's own log of the faulted run is kept beside its records (the server's words, not only ours)
    kept = sorted((Path(r.run_dir) / "engine-logs").glob("*.log"))
    assert kept and any("simulated crash after 8 requests" in f.read_text() for f in kept), kept
    ok = _run(ex, tmp, "after-crash", [])
    dep = next(x for x in _journal(ex, "after-crash") if x.phase == "deploy" and x.event == "outcome")
    assert dep.detail["restarted"] is True and ok.verdict.kind == "valid" and ok.healthy_after
    assert _served(port) == N  # the fresh service saw exactly one load
    # requests done / N as the runner counted them on the target while waiting (what GET /goals/G shows)
    prog = json.loads((tmp / "runs" / "after-crash" / "progress.json").read_text())
    assert (prog["requests_done"], prog["requests_total"]) == (N, N)


def test_truncated_outputs_are_a_contract_violation(world):
    ex, tmp, _ = world
    r = _run(ex, tmp, "tr", ["truncate=0.25"])
    assert r.verdict.kind == "contract_violation"
    short = next(x for x in r.verdict.reasons if x.code == "short_output")
    assert 0 < short.count < N and len(short.request_ids) == short.count  # random 1/4 of them, named


def test_cache_miss_breaks_the_per_request_hit_contract(world):
    ex, tmp, _ = world
    r = _run(ex, tmp, "cm", ["cache_miss=0.5"], scenario="shared", warmup=2)
    assert r.verdict.kind == "contract_violation", r.verdict
    assert [x.code for x in r.verdict.reasons] == ["cache_hit_below"]
    clean = _run(ex, tmp, "cm-clean", [], scenario="shared", warmup=2)
    assert clean.verdict.kind == "valid", clean.verdict  # the same scenario without the fault holds


def test_stats_failure_is_recollected_without_rerunning_the_load(world):
    ex, tmp, port = world
    before = _served_or_zero(port)  # a warm service from an earlier test may be reused
    r = _run(ex, tmp, "sf", [])
    col = [x for x in _journal(ex, "sf") if x.phase == "collect" and x.event == "outcome"]
    assert [(c.status, c.error_class) for c in col] == [("failed", "collection_fault"), ("ok", None)]
    assert r.verdict.kind == "valid" and r.summary.n_ok == N
    served = _served(port) - (0 if _restarted(ex, "sf") else before)
    assert _log(tmp).count("start-run sf.load ") == 1 and served == N  # one load, collected twice
    total = _served(port)
    assert _run(ex, tmp, "sf", []) == r  # asking again returns the result, sends nothing
    assert _served(port) == total
