"""The twin's model-based search against the ascent it replaced (issue 43 item 4), on the twin's own figures.

For each bench case (bench/scenarios.yaml, never the held-out half) whose space is larger than one proposal's count
of stations (agent.planner.twin_space.STATIONS_PER_PROPOSAL), the goal's twin before its first run (the prior: in a
plain case, the truth) is searched from the goal's start station three ways: the one-change neighbourhood and
coordinate ascent (the search before item 4, each station simulated once), the model-based search
(twin_space.model_based: neighbourhood, seeded TPE, polish), and every station of the modelled space (the twin's
exact optimum). Prints per case the space, the stations each simulated, the objective each found (feasible or not)
and its gap to the exhaustive optimum, smallest space first. Minutes per case: the exhaustive search simulates the
whole space.

    python bench/twin_search.py [--only CASE ...]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tuners.cases import load_cases  # noqa: E402


def ascent(h: Any, twin: Any, budget: int) -> Any:
    """The search before issue 43 item 4: the best station's one-change neighbours, then a coordinate ascent that
    follows the best neighbour while it gains, within the same count."""
    from agent.planner import twin_space as ts
    seen: dict[str, Any] = {}

    def at(knobs: dict[str, Any]) -> Any:
        key = ts.dumps(knobs)
        if key not in seen:
            seen[key] = ts.predicted(h, twin, knobs)
        return seen[key]

    base, left = at(h.best_knobs)
    space = {k: list(v) for k, v in h.goal.space().items() if v and k not in left}
    cur = base
    while True:
        steps = ts._neighbours(h, space, cur.knobs, at, seen, budget)
        top = max((st for _, _, st in steps), key=ts.Station.score, default=None)
        if top is None or top.objective is None or top.score() <= cur.score():
            return ts.Search(base=base, singles=[], path=[], optimum=cur, simulated=len(seen))
        cur = top


def words(st: Any, exact: Any) -> str:
    gap = st.objective / exact.objective - 1.0 if st.objective and exact.objective else math.nan
    return f"{st.objective:10.2f} {'feasible' if st.feasible else 'BREAKS  '} {gap:+7.2%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=str(ROOT / "bench" / "scenarios.yaml"), help="case file (YAML)")
    ap.add_argument("--only", action="append", default=[], help="only this case (repeatable)")
    args = ap.parse_args(argv)
    from agent.planner import History
    from agent.planner import twin_space as ts
    from executor.targets import builtin_sim
    from executor.twin import Twins, prior_of

    size = lambda c: math.prod(len(v) for v in c.space_for(False).values())  # noqa: E731
    cases = sorted((c for c in load_cases(args.cases).cases if c.set != "heldout" and size(c) > ts.STATIONS_PER_PROPOSAL
                    and (not args.only or c.name in args.only)), key=size)  # the smallest (quickest) first
    print(f"{'case':36} {'space':>5} | {'ascent: sims  objective':>24} {'':8} {'gap':>7} | "
          f"{'model-based: sims  objective':>28} {'':8} {'gap':>7} | {'exhaustive':>10} | s (new)", flush=True)
    with tempfile.TemporaryDirectory(prefix="twin-search-") as tmp:
        for case in cases:
            goal = case.goal_spec(False, 0)
            twin = Twins(Path(tmp), disk=None).fit(prior_of(builtin_sim(), goal.sim_profile), ())  # timed: none on disk
            h = History(goal_id=case.name, goal=goal, data_version="bench", best_knobs=goal.start_station(),
                        budget_left_card_hours=goal.budget.card_hours, experiments_left=goal.budget.experiments)
            old = ascent(h, twin, ts.STATIONS_PER_PROPOSAL)
            t0 = time.perf_counter()
            new = ts.search(h, twin)
            wall = time.perf_counter() - t0
            size = math.prod(len(v) for v in goal.space().values())
            exact = ts.search(h, twin, budget=size)
            assert new is not None and exact is not None and exact.exhaustive
            print(f"{case.name:36} {size:5d} | {old.simulated:10d} {words(old.optimum, exact.optimum)} | "
                  f"{new.simulated:14d} {words(new.optimum, exact.optimum)} | {exact.optimum.objective:10.2f} "
                  f"({'feasible' if exact.optimum.feasible else 'breaks'}, {exact.simulated} sims) | {wall:.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
