"""The loop's best station on the real llama.cpp server vs the best of an exhaustive sweep, in one run.

Same machine, same scenario, same SLO, same discretised knobs (the goal's search space): first the
exhaustive sweep (every combination, one run each at screen N through the executor), then the loop from
the goal's start station. Prints both bests (throughput, mean TPOT, knobs), experiments and wall time.
Run: .venv/bin/python bench/llamacpp_vs_sweep.py [--goal examples/goal-llamacpp.yaml] [--out DIR]
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--goal", default="examples/goal-llamacpp.yaml")
    ap.add_argument("--out", default=".tuneloop/bench-llamacpp")
    args = ap.parse_args()

    from agent.record import build_history
    from agent.session import run_session
    from executor.llamacpp import prepare
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import load_targets
    from executor.trial import TrialSpec
    from state.goal import load_goal
    from state.store import Store

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    goal = load_goal(args.goal)
    info = prepare(out, goal.scenario)
    targets = load_targets(info["targets"])
    start, space = goal.start_station(), goal.space()
    obj = goal.objective

    # exhaustive sweep
    store = Store(f"sqlite:///{out / 'sweep.db'}")
    ex = Executor(store, targets, ExecSettings(runs_root=out / "sweep-runs", holder="bench-sweep"))
    rows, t0 = [], time.perf_counter_ns()
    names = sorted(space)
    for combo in itertools.product(*(space[k] for k in names)):
        knobs = start | dict(zip(names, combo))
        rid = "sweep-" + "-".join(f"{k}{v}" for k, v in zip(names, combo))
        res = ex.run_trial(TrialSpec(run_id=rid, goal_id="sweep", target=goal.target, scenario=goal.scenario,
                                     knobs=knobs, stage="screen", n=goal.protocol.screen_n,
                                     warmup=goal.protocol.warmup, seed=goal.protocol.seeds[0]))
        s = res.summary
        ok = res.verdict.kind == "valid" and s is not None and not goal.constraints.violations(s)
        rows.append({"knobs": dict(zip(names, combo)), "verdict": res.verdict.kind, "meets_slo": ok,
                     "objective": obj.value(s) if s is not None else None,
                     "tpot_mean_ms": s.tpot_ms.mean if s is not None else None})
        print(f"sweep {rows[-1]}", flush=True)
    sweep_s = (time.perf_counter_ns() - t0) / 1e9
    store.close()
    feasible = [r for r in rows if r["meets_slo"] and r["objective"] is not None]
    sweep_best = max(feasible, key=lambda r: r["objective"]) if feasible else None

    # the loop
    url = f"sqlite:///{out / 'loop.db'}"
    store = Store(url)
    ex = Executor(store, targets, ExecSettings(runs_root=out / "loop-runs", holder="bench-loop"))
    t0 = time.perf_counter_ns()
    res = run_session(goal, url, auto_approve=True, executor=ex)
    loop_s = (time.perf_counter_ns() - t0) / 1e9
    hist = build_history(store, res.goal_id)
    best = hist.best_knobs
    ref = hist.latest_valid(best)
    loop_fig = obj.value(ref.summary) if ref and ref.summary else None
    loop_runs = len(store.runs(res.goal_id))
    store.close()

    report = {
        "scenario": goal.scenario, "slo": goal.constraints.latency_limits(), "objective": f"{obj.metric} ({obj.window})",
        "space": {k: list(v) for k, v in space.items()}, "model_sha256": info["model_sha256"],
        "sweep": {"experiments": len(rows), "wall_s": round(sweep_s, 1), "best": sweep_best},
        "loop": {"experiments": loop_runs, "wall_s": round(loop_s, 1), "stop": res.reason,
                 "best": {"knobs": {k: best.get(k) for k in space}, "objective": loop_fig,
                          "tpot_mean_ms": ref.summary.tpot_ms.mean if ref and ref.summary else None}},
    }
    if sweep_best and loop_fig:
        report["loop_vs_sweep_pct"] = round(100 * (loop_fig / sweep_best["objective"] - 1), 2)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    print("note: each figure is one measurement on a shared CPU; differences of a few % are noise.")


if __name__ == "__main__":
    main()
