"""The loop's best station on a real engine vs the best of an exhaustive sweep: the engine-independent body.

Same machine, same scenario, same SLO, same discretised knobs (the goal's search space): first the exhaustive
sweep (every combination, one run each at the goal's confirm N, the N at which the loop confirms its best), then
the loop from the goal's start station, then both best stations once more, back to back at confirm N (on a shared
CPU host the machine's speed drifts between the sweep and the loop; the head-to-head pair is the like-for-like
figure). bench/llamacpp_vs_sweep.py and bench/vllm_vs_sweep.py call `compare` with their engine's targets file.

The sweep walks the knobs that need a restart outermost and the load knobs (concurrency, ...) innermost, so the
executor reuses the warm server across the stations that differ only in load: the sweep pays one restart per
server configuration, as an operator's grid would, not one per station.
"""
from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

NOTE = "note: each figure is one measurement on a shared CPU; differences of a few % are noise."
WITHIN_PCT = 2.0  # the must-hold: the loop's best within 2 % of the sweep's best, head to head ...
DEVICE_SHARE = 1 / 3  # ... with at most 1/3 of the sweep's device time


def in_fresh_dir(out: Path, stop: Callable[[Path], Any], body: Callable[[], None]) -> None:
    """Run `body` in an emptied `out`, stopping the engine's servers under it before (a server left by an earlier,
    interrupted run would hold the port) and after, also on error (the loop leaves its best station running)."""
    stop(out)
    shutil.rmtree(out, ignore_errors=True)
    try:
        body()
    finally:
        stop(out)


def sweep_order(space: dict[str, Sequence[Any]]) -> list[str]:
    """The space's knobs, the costliest to change outermost (restart before hot), by name within a cost class."""
    from core.knobs import COST_ORDER, catalog

    cat = catalog()
    cost = {k: COST_ORDER[cat.get(k).cost_class] if k in cat else COST_ORDER["restart"] for k in space}
    return sorted(space, key=lambda k: (-cost[k], k))


def stations(space: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the space, in sweep order (the innermost knob changes fastest)."""
    names = sweep_order(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[k] for k in names))]


def sweep_best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep's best row: the highest objective among the rows that met the SLO; None when none did."""
    feasible = [r for r in rows if r["meets_slo"] and r["objective"] is not None]
    return max(feasible, key=lambda r: r["objective"]) if feasible else None


def limit_figures(goal: Any, s: Any) -> dict[str, float | None]:
    """Each latency limit's figure of a run at its own statistic (e.g. ttft_p99_ms), so a row of a tail goal shows
    what binds it, not only the mean TPOT."""
    return {lim.figure_key: (lim.figure(s) if s is not None else None) for lim in goal.view().limits}


def pct(a: float | None, b: float | None) -> float | None:
    """a relative to b in %, rounded to 0.01; None without both figures."""
    return round(100 * (a / b - 1), 2) if a and b else None


def must_hold(sweep_device_s: float, loop_device_s: float, head_to_head_pct: float | None,
              limited: bool) -> dict[str, Any]:
    """The issue's must-hold: the loop's best within WITHIN_PCT of the sweep's, head to head, with at most
    DEVICE_SHARE of the sweep's device time. `holds` is None when the sweep was limited (a smoke run: its device
    time and its best are not the full space's), False when a figure is missing."""
    share = round(loop_device_s / sweep_device_s, 3) if sweep_device_s > 0 else None
    if limited:
        holds = None
    else:
        holds = (head_to_head_pct is not None and share is not None
                 and head_to_head_pct >= -WITHIN_PCT and share <= DEVICE_SHARE)
    return {"loop_device_share": share, "head_to_head_pct": head_to_head_pct, "holds": holds}


def twin_errors(ex: Any, store: Any, goal: Any, goal_id: str) -> dict[str, Any]:
    """The goal's twin as the loop saw it: its prior's origin and, run by run, the objective the twin fitted on the
    runs before predicted beside what the run measured (agent.planner.twin.fidelity, out of sample); the median
    absolute error of the predictions made by a fit on at least two runs."""
    from statistics import median

    from agent.loop.record import build_history
    from agent.planner.twin import fidelity

    fitter = ex.twin_fitter(goal.target, goal.sim_profile)
    if fitter is None:
        return {"origin": None, "why": "no twin on this target"}
    first = fitter(())
    if isinstance(first, str):
        return {"origin": None, "why": first}
    fid = fidelity(build_history(store, goal_id), fitter)
    rows = [{"run": s.run_id, "predicted": round(s.predicted, 3), "measured": round(s.measured, 3),
             "error_pct": round(100 * s.error, 2), "fitted_on": k} for k, s in enumerate(fid.scored)]
    later = [abs(r["error_pct"]) for r in rows if r["fitted_on"] >= 2]
    return {"origin": first.origin, "leads": fid.leads, "why": fid.why, "runs": rows,
            "median_abs_error_pct_after_2": round(median(later), 2) if later else None}


def compare(goal: Any, targets: dict[str, Any], out: Path, model_sha256: str, *, limit: int | None = None,
            twin: bool | None = None, rules_too: bool = False) -> dict[str, Any]:
    """Sweep, loop, head to head on `goal.target` of `targets` (a prepared real engine); the report (not written).
    `limit`: sweep only the first K stations (a smoke run, said in the report). `twin`: run_session's.
    `rules_too`: after the loop, the same goal again as a new goal with the evidence rules alone (no twin), on the
    same warm machine, its experiments and device time beside the loop's."""
    from agent.loop.record import build_history
    from agent.loop.session import run_session
    from core.trial import TrialSpec
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from state.store import Store

    start, space = goal.start_station(), goal.space()
    obj, proto = goal.objective, goal.protocol

    def confirm(run_id: str, goal_id: str, knobs: dict[str, Any]) -> Any:
        return ex.run_trial(TrialSpec(run_id=run_id, goal_id=goal_id, target=goal.target, scenario=goal.scenario,
                                      knobs=knobs, stage="confirm", n=proto.confirm_n, warmup=proto.warmup,
                                      seed=proto.seeds[0]))

    def figures(res: Any) -> dict[str, Any]:
        s = res.summary
        return {"verdict": res.verdict.kind,
                "meets_slo": res.verdict.kind == "valid" and s is not None and not goal.constraints.violations(s),
                "objective": obj.value(s) if s is not None else None,
                "tpot_mean_ms": s.tpot_ms.mean if s is not None else None} | limit_figures(goal, s)

    # one store (and so one lease epoch sequence on the target) for the sweep, the loop and the head-to-head
    url = f"sqlite:///{out / 'bench.db'}"
    store = Store(url)
    ex = Executor(store, targets, ExecSettings(runs_root=out / "runs", holder="bench"))
    ex.bind_sim_profile(goal.target, goal.sim_profile)  # a simulated goal: the goal's profile, as the loop runs it

    # exhaustive sweep
    every = stations(space)
    todo = every[:limit] if limit is not None else every
    rows, t0, sweep_device_s = [], time.perf_counter_ns(), 0.0
    for st in todo:
        res = confirm("sweep-" + "-".join(f"{k}{v}" for k, v in st.items()), "sweep", start | st)
        sweep_device_s += sum(c.seconds for c in res.costs)
        rows.append({"knobs": st} | figures(res))
        print(f"sweep {rows[-1]}" + (f" error: {res.error}" if res.error else ""), flush=True)
    sweep_s = (time.perf_counter_ns() - t0) / 1e9
    best_row = sweep_best(rows)

    # the loop
    t0 = time.perf_counter_ns()
    res = run_session(goal, url, auto_approve=True, executor=ex, twin=twin)
    loop_s = (time.perf_counter_ns() - t0) / 1e9
    hist = build_history(store, res.goal_id)
    best = hist.best_knobs
    ref = hist.reference(best, proto.confirm_n)  # the loop's own figure of its best at confirm N
    loop_fig = obj.value(ref.summary) if ref and ref.summary else None
    loop_runs = store.runs(res.goal_id)
    def device_s(runs: list[Any]) -> float:
        return sum(c.seconds for r in runs if (got := store.get_result(r.id)) for c in got.result.costs)

    loop_device_s = device_s(loop_runs)
    decisions = [f"{o.card.stage} N={o.card.n} {' '.join(f'{k}={o.card.knobs.get(k)}' for k in space)}: "
                 f"{o.decision}: {o.reason}" for o in hist.outcomes]
    fid = twin_errors(ex, store, goal, res.goal_id) if twin is not False else None
    rules = None
    if rules_too:
        t0 = time.perf_counter_ns()
        r2 = run_session(goal, url, auto_approve=True, executor=ex, twin=False, new_goal=True)
        h2 = build_history(store, r2.goal_id)
        ref2 = h2.reference(h2.best_knobs, proto.confirm_n)
        runs2 = store.runs(r2.goal_id)
        rules = {"experiments": len(runs2), "wall_s": round((time.perf_counter_ns() - t0) / 1e9, 1),
                 "device_s": round(device_s(runs2), 1), "stop": r2.reason,
                 "best": {"knobs": {k: h2.best_knobs.get(k) for k in space},
                          "objective": obj.value(ref2.summary) if ref2 and ref2.summary else None}}

    # head to head: both bests back to back, same N, same minute of the machine
    head = {}
    for who, knobs in (("loop", best), ("sweep", start | best_row["knobs"] if best_row else None)):
        if knobs is not None:
            head[who] = {"knobs": {k: knobs.get(k) for k in space}} | figures(confirm(f"head-{who}", "head", knobs))
    store.close()

    report: dict[str, Any] = {
        "scenario": goal.scenario, "slo": goal.constraints.latency_limits(), "objective": f"{obj.metric} ({obj.window})",
        "space": {k: list(v) for k, v in space.items()}, "model_sha256": model_sha256, "n": proto.confirm_n,
        "sweep": {"experiments": len(rows), "wall_s": round(sweep_s, 1), "device_s": round(sweep_device_s, 1),
                  "best": best_row, "rows": rows},
        "loop": {"experiments": len(loop_runs), "wall_s": round(loop_s, 1), "device_s": round(loop_device_s, 1),
                 "stop": res.reason, "decisions": decisions,
                 "best": {"knobs": {k: best.get(k) for k in space}, "objective": loop_fig,
                          "tpot_mean_ms": ref.summary.tpot_ms.mean if ref and ref.summary else None}
                         | limit_figures(goal, ref.summary if ref else None)},
        "head_to_head": head,
    }
    if fid is not None:
        report["loop"]["twin"] = fid
    if rules is not None:
        report["rules_alone"] = rules
    if len(todo) < len(every):
        report["sweep"]["limited"] = f"a smoke run: the sweep measured only the first {len(todo)} of the space's " \
                                     f"{len(every)} stations (--limit {limit})"
    if best_row and loop_fig:  # same N (confirm N), different minutes of the machine
        report["loop_vs_sweep_pct"] = pct(loop_fig, best_row["objective"])
    if (h2h := pct(head.get("loop", {}).get("objective"), head.get("sweep", {}).get("objective"))) is not None:
        report["head_to_head_pct"] = h2h
    return report


def write(report: dict[str, Any], out: Path) -> None:
    """report.json under `out`, and the report on stdout."""
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    print(NOTE)
