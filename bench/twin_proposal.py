"""The twin's proposal time (issue 38 item 4): one planner proposal with the goal's twin, on one core.

For a case of bench/scenarios.yaml (default the 2160-point `dsv4-16k-copy-zero-cache-wide`), the loop runs the goal's
baseline (twin off), then the deterministic planner's ranked candidates are asked with a fresh twin: the fit to the
baseline, the twin's out-of-sample score of it, its search of the space (model-based: the best station's one-change
neighbourhood, a TPE study and a polish, at most agent.planner.twin_space.STATIONS_PER_PROPOSAL stations at the
confirm N) and the valuation of every pooled move. Prints the wall seconds per proposal (median of --repeat, each with a fresh twin: nothing cached), the
stations simulated, and the twin's optimum; the target is <= 30 s.

    python bench/twin_proposal.py [--only CASE] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tuners.cases import load_cases  # noqa: E402

TARGET_S = 30.0  # issue 38 item 4: one proposal on the 2160-point wide 16K space


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=str(ROOT / "bench" / "scenarios.yaml"), help="case file (YAML)")
    ap.add_argument("--only", default="dsv4-16k-copy-zero-cache-wide", help="the case")
    ap.add_argument("--repeat", type=int, default=3, help="proposals timed, each with a fresh twin")
    args = ap.parse_args(argv)
    from agent.loop.record import build_history
    from agent.loop.session import run_session
    from agent.planner import candidates, diagnosis_for
    from agent.planner import twin as tw  # the twin's fidelity and search, what this bench times
    from executor.twin import Twins, prior_of
    from executor.targets import builtin_sim
    from state.store import Store

    case = next((c for c in load_cases(args.cases).cases if c.name == args.only), None)
    if case is None:
        print(f"error: no case {args.only!r} in {args.cases}", file=sys.stderr)
        return 2
    goal = case.goal_spec(False, 0)
    goal = goal.model_copy(update={"budget": goal.budget.model_copy(update={"experiments": 1})})
    size = 1
    for values in case.space_for(False).values():
        size *= len(values)
    with tempfile.TemporaryDirectory(prefix="twin-proposal-") as tmp:
        import os
        os.environ["TUNELOOP_RUNS_ROOT"] = str(Path(tmp) / "runs")
        url = f"sqlite:///{Path(tmp) / 't.db'}"
        res = run_session(goal, url, auto_approve=True, who="twin proposal bench", twin=False)
        st = Store(url)
        try:
            h = build_history(st, res.goal_id).model_copy(update={"experiments_left": 10})
        finally:
            st.close()
        prior = prior_of(builtin_sim(), goal.sim_profile)
        walls, found = [], None
        for _ in range(args.repeat):
            twins = Twins(Path(tmp) / "runs", disk=None)  # fresh: no fit and no prediction cached (nor on disk)
            fitter = lambda runs, t=twins: t.fit(prior, tuple(runs))  # noqa: E731
            t0 = time.perf_counter()
            ranked = candidates(h.with_twin(fitter), diagnosis_for(h))
            walls.append(time.perf_counter() - t0)
            fid = tw.fidelity(h, fitter)
            found = tw.search(h, fid.twin) if fid.twin is not None else None
    med = statistics.median(walls)
    print(f"case {case.name}: space {size} points, {len(ranked)} ranked moves")
    if found is not None:
        path = " + ".join(f"{k}={v!r}" for k, v in found.path) or "the best station itself"
        print(f"twin: {found.simulated} stations simulated per search; optimum {path} "
              f"({(tw.gain(found.optimum, found.base) or 0.0):+.1%} over the baseline)")
    print(f"wall per proposal (median of {len(walls)}): {med:.1f} s  [{', '.join(f'{w:.1f}' for w in walls)}]  "
          f"target <= {TARGET_S:.0f} s: {'HOLDS' if med <= TARGET_S else 'MISSES'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
