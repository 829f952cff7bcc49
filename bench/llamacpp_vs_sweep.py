"""The loop's best station on the real llama.cpp server vs the best of an exhaustive sweep, in one run.

Same machine, same scenario, same SLO, same discretised knobs (the goal's search space): first the
exhaustive sweep (every combination, one run each at the goal's confirm N, the N at which the loop
confirms its best), then the loop from the goal's start station, then both best stations once more,
back to back at confirm N (on a shared CPU host the machine's speed drifts between the sweep and the
loop; the head-to-head pair is the like-for-like figure). Prints both bests (throughput, mean TPOT,
knobs), experiments, wall time and the device time the executor charged (restart + load seconds).
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

    from executor.engines.llamacpp_cli import stop

    out = Path(args.out).resolve()
    stop(out)  # a server left by an earlier, interrupted run would hold the port
    shutil.rmtree(out, ignore_errors=True)
    try:
        run(args, out)
    finally:
        stop(out)


def run(args: argparse.Namespace, out: Path) -> None:
    from agent.loop.record import build_history
    from agent.loop.session import run_session
    from core.trial import TrialSpec
    from executor.engines.llamacpp_cli import prepare
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import load_targets
    from state.goal import load_goal
    from state.store import Store

    goal = load_goal(args.goal)
    info = prepare(out, goal.scenario)
    targets = load_targets(info["targets"])
    start, space = goal.start_station(), goal.space()
    obj = goal.objective

    # one store (and so one lease epoch sequence on the target) for the sweep, the loop and the head-to-head
    url = f"sqlite:///{out / 'bench.db'}"
    store = Store(url)
    ex = Executor(store, targets, ExecSettings(runs_root=out / "runs", holder="bench"))

    # exhaustive sweep
    rows, t0, sweep_device_s = [], time.perf_counter_ns(), 0.0
    names = sorted(space)
    for combo in itertools.product(*(space[k] for k in names)):
        knobs = start | dict(zip(names, combo))
        rid = "sweep-" + "-".join(f"{k}{v}" for k, v in zip(names, combo))
        res = ex.run_trial(TrialSpec(run_id=rid, goal_id="sweep", target=goal.target, scenario=goal.scenario,
                                     knobs=knobs, stage="confirm", n=goal.protocol.confirm_n,
                                     warmup=goal.protocol.warmup, seed=goal.protocol.seeds[0]))
        sweep_device_s += sum(c.seconds for c in res.costs)
        s = res.summary
        ok = res.verdict.kind == "valid" and s is not None and not goal.constraints.violations(s)
        rows.append({"knobs": dict(zip(names, combo)), "verdict": res.verdict.kind, "meets_slo": ok,
                     "objective": obj.value(s) if s is not None else None,
                     "tpot_mean_ms": s.tpot_ms.mean if s is not None else None})
        print(f"sweep {rows[-1]}" + (f" error: {res.error}" if res.error else ""), flush=True)
    sweep_s = (time.perf_counter_ns() - t0) / 1e9
    feasible = [r for r in rows if r["meets_slo"] and r["objective"] is not None]
    sweep_best = max(feasible, key=lambda r: r["objective"]) if feasible else None

    # the loop
    t0 = time.perf_counter_ns()
    res = run_session(goal, url, auto_approve=True, executor=ex)
    loop_s = (time.perf_counter_ns() - t0) / 1e9
    hist = build_history(store, res.goal_id)
    best = hist.best_knobs
    ref = hist.reference(best, goal.protocol.confirm_n)  # the loop's own figure of its best at confirm N
    loop_fig = obj.value(ref.summary) if ref and ref.summary else None
    loop_runs = store.runs(res.goal_id)
    loop_device_s = sum(c.seconds for r in loop_runs if (got := store.get_result(r.id)) for c in got.result.costs)
    decisions = [f"{o.card.stage} N={o.card.n} parallel={o.card.knobs.get('parallel')}: {o.decision}: {o.reason}"
                 for o in hist.outcomes]

    # head to head: both bests back to back, same N, same minute of the machine
    head = {}
    for who, knobs in (("loop", best), ("sweep", start | sweep_best["knobs"] if sweep_best else None)):
        if knobs is None:
            continue
        r = ex.run_trial(TrialSpec(run_id=f"head-{who}", goal_id="head", target=goal.target, scenario=goal.scenario,
                                   knobs=knobs, stage="confirm", n=goal.protocol.confirm_n,
                                   warmup=goal.protocol.warmup, seed=goal.protocol.seeds[0]))
        s = r.summary
        head[who] = {"knobs": {k: knobs.get(k) for k in space}, "verdict": r.verdict.kind,
                     "objective": obj.value(s) if s is not None else None,
                     "tpot_mean_ms": s.tpot_ms.mean if s is not None else None,
                     "meets_slo": r.verdict.kind == "valid" and s is not None and not goal.constraints.violations(s)}
    store.close()

    report = {
        "scenario": goal.scenario, "slo": goal.constraints.latency_limits(), "objective": f"{obj.metric} ({obj.window})",
        "space": {k: list(v) for k, v in space.items()}, "model_sha256": info["model_sha256"],
        "n": goal.protocol.confirm_n,
        "sweep": {"experiments": len(rows), "wall_s": round(sweep_s, 1), "device_s": round(sweep_device_s, 1),
                  "best": sweep_best, "rows": rows},
        "loop": {"experiments": len(loop_runs), "wall_s": round(loop_s, 1), "device_s": round(loop_device_s, 1),
                 "stop": res.reason, "decisions": decisions,
                 "best": {"knobs": {k: best.get(k) for k in space}, "objective": loop_fig,
                          "tpot_mean_ms": ref.summary.tpot_ms.mean if ref and ref.summary else None}},
        "head_to_head": head,
    }
    if sweep_best and loop_fig:  # same N (confirm N), different minutes of the machine
        report["loop_vs_sweep_pct"] = round(100 * (loop_fig / sweep_best["objective"] - 1), 2)
    if all(head.get(w, {}).get("objective") for w in ("loop", "sweep")):
        report["head_to_head_pct"] = round(100 * (head["loop"]["objective"] / head["sweep"]["objective"] - 1), 2)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    print("note: each figure is one measurement on a shared CPU; differences of a few % are noise.")


if __name__ == "__main__":
    main()
