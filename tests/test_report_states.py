"""Reports of goals in particular states, from hand-built store contents: a quality-pending station shown apart
and never as the best; a goal with no runs still renders and says why its plots are missing."""
from __future__ import annotations

import re
from pathlib import Path

from agent.report import build_report, render
from state.goal import load_goal

ROOT = Path(__file__).resolve().parents[1]


def test_quality_pending_is_shown_apart_and_never_as_the_best(store, make_result, tmp_path):
    from core.station import Station
    from core.trial import TrialSpec

    spec = load_goal(ROOT / "examples/goal-16k.yaml")
    goal = store.create_goal(spec)
    knobs = spec.start_station()
    base = Station(engine="sim", knobs=knobs, scenario=spec.scenario, data_version="dv1", source_identity="src1",
                   target="sim")
    fast = base.model_copy(update={"knobs": {**knobs, "index_cache_reuse": True}})
    for i, (st, kind, whole, native) in enumerate(((base, "baseline", 200.0, 210.0),
                                                   (fast, "quality_pending", 260.0, None))):
        store.put_station(st)
        rid = f"{goal.id}-r{i}"
        store.create_run(TrialSpec(run_id=rid, goal_id=goal.id, target="sim", scenario=spec.scenario, knobs=st.knobs,
                                   stage="baseline" if i == 0 else "confirm", n=640), station_hash=st.hash)
        store.record_result(make_result(rid, whole=whole, native=native, station_hash=st.hash), goal_id=goal.id)
        store.record_decision(goal.id, kind, run_id=rid, station_hash=st.hash, changed=i == 1, text=f"{kind} text",
                              data={"outcome": "reference" if i == 0 else kind, "verdict": "valid", "knobs": st.knobs})
    pending_run = f"{goal.id}-r1"
    paths = render(build_report(store, goal.id), tmp_path / "a")
    page = paths.html.read_text()
    assert re.search(r'<table class="kv best">.*?<td class="value">' + base.hash, page, re.S)
    row = re.search(rf'<table class="pending">.*?<tr data-key="{pending_run}">(.*?)</tr>', page, re.S).group(1)
    assert fast.hash in row and "performance-positive, quality pending" in row
    # the pending run stays a row of the trade-off table (it is valid), with its native cell empty
    trow = re.search(rf'<table class="tradeoff n-640">.*?<tr data-key="{pending_run}">(.*?)</tr>', page, re.S).group(1)
    assert '<td class="native num"></td>' in trow and '<td class="whole num">260.00</td>' in trow
    store.record_decision(goal.id, "quality_failed", run_id=pending_run, station_hash=fast.hash, text="failed")
    rep = build_report(store, goal.id)
    assert rep.content.pending == [] and [e.run.id for e in rep.content.quality_failed] == [pending_run]
    assert rep.content.best_station.hash == base.hash
    page = render(rep, tmp_path / "b").html.read_text()
    assert "quality evaluation failed: never deployable" in page


def test_a_goal_with_no_runs_still_renders_and_says_why_plots_are_missing(store, tmp_path):
    goal = store.create_goal(load_goal(ROOT / "examples/goal-16k.yaml"))
    rep = build_report(store, goal.id)
    md = render(rep, tmp_path).markdown.read_text()
    assert "No experiment has run yet." in md and "No deployable best station yet." in md
    assert set(rep.missing) == {"queues", "prefill_batches"} and "queues: not drawn — no valid candidate" in md
    assert rep.frontiers == ("tput_tpot_mean",)  # the goal's one limit, at its own statistic
    assert rep.plots["tput_tpot_mean"].series["points"] == [] and rep.plots["progress"].series["best"] == []
    assert "| per_card |" in md  # the definitions are stated even before a run recorded them
