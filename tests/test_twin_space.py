"""The twin's model-based search (agent/planner/twin_space.py): where the modelled space is larger than the count of
stations a proposal may simulate, it finds the twin's exhaustive optimum where a coordinate ascent from the best
station stops at once (no single change gains: the goodput optimum needs the rate and the decode batch raised
together), and the same inputs give the same search."""
from __future__ import annotations

import math
from pathlib import Path

from agent.planner import History
from agent.planner import twin as tw
from bench.tuners.cases import load_cases
from executor.twin import Twin, Twins

ROOT = Path(__file__).resolve().parents[1]
CASE = "llama70b-h100-goodput-tail-slos"  # goodput under TTFT p99 + TPOT p99 limits on llama70b-h100-p2d2
KNOBS = ("request_rate", "max_num_seqs", "concurrency")  # its space without the batched-token budget: 90 stations
COUNT = 48  # stations the search may simulate, about half the space


def _goal():  # type: ignore[no-untyped-def]
    case = next(c for c in load_cases(ROOT / "bench" / "scenarios.yaml").cases if c.name == CASE)
    g = case.goal_spec(False, 0)
    return g.model_copy(update={"search_space": {k: v for k, v in g.search_space.items() if k in KNOBS}})


def test_the_model_based_search_finds_the_optimum_where_the_ascent_from_the_best_station_stops(tmp_path):
    goal = _goal()
    size = math.prod(len(v) for v in goal.space().values())
    assert size > COUNT
    twin = Twins(tmp_path).fit(goal.sim_profile, ())  # the prior, a real simulator profile: the twin before any run
    assert isinstance(twin, Twin)
    h = History(goal_id="g", goal=goal, data_version="dv", best_knobs=goal.start_station(),
                budget_left_card_hours=100.0, experiments_left=10)
    found = tw.search(h, twin, budget=COUNT)
    assert found is not None and not found.exhaustive and found.simulated <= COUNT
    # the ascent would stop where it starts: no one-change neighbour of the best station scores above it
    assert found.singles and all(st.score() <= found.base.score() for _, _, st in found.singles)
    whole = tw.search(h, twin, budget=size)
    assert whole is not None and whole.exhaustive
    best = whole.optimum
    assert best.feasible and best.objective > 1.3 * found.base.objective  # far above where the ascent stops
    assert found.optimum.feasible and found.optimum.objective >= 0.98 * best.objective, (found.optimum, best)
    assert len(found.path) >= 2  # reached by changing several knobs together
    again = tw.search(h, twin, budget=COUNT)  # type: ignore[arg-type]
    assert again is not None and (again.optimum.knobs, again.path, again.simulated) == \
        (found.optimum.knobs, found.path, found.simulated)
