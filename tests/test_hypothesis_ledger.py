"""The hypothesis ledger (core.ledger): every experiment of `make demo` carries a numeric prediction, its run the
observed effect; the report, the KPIs and the API (a real `tuneloop serve`) show them, scored."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.ledger import Interval, Observation, Prediction, by_source, median_abs_error, score
from state.hypotheses import hypothesis_ledger
from state.kpis import compute_kpis
from state.store import Store
from tests.test_api_support import ServerProcess, auth, service_env

TUNELOOP = Path(sys.executable).with_name("tuneloop")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ledger-demo")
    # the rules' own 8-run trajectory (value-model and explorer predictions): this module tests the ledger, not the
    # twin, whose demo (on by default) tests/test_demo_pinned.py pins
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {"TUNELOOP_TWIN": "off"}
    proc = subprocess.run([str(TUNELOOP), "demo"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    store = Store(f"sqlite:///{cwd / '.tuneloop' / 'demo' / 'tuneloop.db'}")
    (goal,) = store.goals()
    yield cwd, store, goal.id, proc.stdout
    store.close()


def test_every_demo_experiment_has_a_prediction_and_an_observation_scored(demo):
    _, store, gid, out = demo
    runs = [r for r in store.runs(gid) if r.stage != "restore"]
    rows = hypothesis_ledger(store, gid)
    assert len(runs) == 8 and sorted(r.run_id for r in rows) == sorted(r.id for r in runs)
    for r in rows:
        p = r.prediction
        assert p.source in ("value_model", "explorer") and p.slo == "tpot_mean_ms_lt"
        assert p.objective_effect.lo <= p.objective_effect.value <= p.objective_effect.hi
        assert r.observation is not None
    changes = [r for r in rows if not r.title.endswith("the parent station")]
    assert changes and all(r.objective_error is not None and r.slo_error is not None for r in changes)
    # the error is what it says: |observed - predicted| on the stored figures of the run and its parent
    first = changes[0]
    figs = {d.run_id: d.data["figures"] for d in store.decisions(gid) if d.run_id and "figures" in (d.data or {})}
    w = first.observation.window
    assert w in ("native", "whole")
    obs = figs[first.run_id][w] / figs[first.observation.against][w] - 1
    assert first.objective_error == pytest.approx(abs(obs - first.prediction.objective_effect.value), abs=1e-9)
    k = compute_kpis(store, gid)
    errs = [r.objective_error for r in rows if r.objective_error is not None]
    assert k.predictions_scored == len(errs) >= 5
    assert k.median_abs_prediction_error == pytest.approx(statistics.median(errs))
    assert f"median absolute prediction error {k.median_abs_prediction_error:.1%}" in out


def test_the_report_shows_predicted_vs_observed_per_card_and_per_source(demo):
    cwd, store, gid, _ = demo
    md = next((cwd / ".tuneloop" / "demo" / "reports").glob("*/report.md")).read_text()
    part = md.split("## Hypothesis ledger")[1].split("\n## ")[0]
    rows = hypothesis_ledger(store, gid)
    for r in rows:
        line = next(x for x in part.splitlines() if x.startswith(f"| {r.run_id} |"))
        assert f"{r.prediction.objective_effect.value * 100:+.1f} %" in line
        if r.objective_error is not None:
            assert f"{r.observation.objective_effect * 100:+.1f} %" in line and f"{r.objective_error * 100:.1f} pt" in line
    by_source = {src: sum(1 for r in rows if r.prediction.source == src) for src in ("value_model", "explorer")}
    assert sum(by_source.values()) == 8 and by_source["explorer"] >= 1  # the demo's last card is the explorer's
    for src, n in by_source.items():
        assert re.search(rf"\| {src} \| {n} \| \d+ \| [\d.]+ pt \|", part)
    kpis = md.split("## Loop KPIs")[1]
    assert f"{compute_kpis(store, gid).median_abs_prediction_error * 100:.1f} pt" in kpis


def test_the_api_serves_the_ledger(demo, tmp_path):
    cwd, store, gid, _ = demo
    env = service_env(tmp_path, f"sqlite:///{cwd / '.tuneloop' / 'demo' / 'tuneloop.db'}")
    srv = ServerProcess(tmp_path, env)
    try:
        got = httpx.get(f"{srv.url}/goals/{gid}/hypotheses", headers=auth("viewer"), timeout=60).json()
        cards = httpx.get(f"{srv.url}/goals/{gid}/candidates", headers=auth("viewer"), timeout=60).json()
        missing = httpx.get(f"{srv.url}/goals/nope/hypotheses", headers=auth("viewer"), timeout=60)
    finally:
        srv.stop()
    rows = hypothesis_ledger(store, gid)
    assert got["median_abs_prediction_error"] == pytest.approx(median_abs_error(rows))
    assert [c["run_id"] for c in got["cards"]] == [r.run_id for r in rows]
    for src in ("value_model", "explorer"):
        assert got["by_source"][src]["cards"] == sum(1 for r in rows if r.prediction.source == src) >= 1
    by_id = {c["id"]: c["card"]["prediction"]["source"] for c in cards}
    assert all(by_id[r.candidate_id] == r.prediction.source for r in rows)
    assert missing.status_code == 404


def test_scoring_and_sources():
    p = Prediction(source="simulator", objective="x", objective_effect=Interval(value=0.1, lo=0.0, hi=0.2))
    rows = [score(1, "a", "t", p, Observation(objective_effect=0.25)),
            score(2, "b", "t", p.model_copy(update={"source": "explorer"}), Observation(objective_effect=0.05)),
            score(3, "c", "t", p, None)]
    assert rows[0].objective_error == pytest.approx(0.15) and rows[0].objective_inside is False
    assert rows[1].objective_inside is True and rows[2].objective_error is None
    assert median_abs_error(rows) == pytest.approx(0.1)
    src = by_source(rows)
    assert src["simulator"]["cards"] == 2 and src["simulator"]["scored"] == 1
    assert src["explorer"]["median_abs_error"] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="lo <= value <= hi"):
        Interval(value=0.3, lo=0.0, hi=0.2)
