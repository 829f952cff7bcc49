"""The twin's search builds only stations the knob catalog accepts, over every bench goal's space and the demo's
(issue 43 item 5: `TUNELOOP_TWIN=on make demo` died in `propose` on a draft width with speculation off), and a
proposer that raises never stops a goal: it yields, and the cards say why."""
from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from agent.planner import History
from agent.planner import twin as tw
from agent.planner.accepted import accepted, refusal
from agent.planner.deterministic import DeterministicPlanner
from agent.planner.proposers import PROPOSERS
from agent.planner.proposers.base import Proposals
from agent.planner.proposers.guarded import asked
from bench.tuners.cases import load_cases
from state.goal import load_goal
from tests.planner_support import GOAL16, baseline, history, outcome, summary

ROOT = Path(__file__).resolve().parents[1]
CASES = load_cases(ROOT / "bench" / "scenarios.yaml")
GOALS = {c.name: c.goal_spec(False, 0) for c in CASES.cases} | {"demo": load_goal(ROOT / "examples" / "goal-16k.yaml")}
BESTS = 24  # best stations per goal the search starts from: the start and a seeded sample of the space's stations
COUNT = 64  # stations per search: a space over it is searched model-based (neighbourhood, TPE, polish), one under it
# whole, so both searches build stations here (at 400 a TPE study over the wide spaces took minutes per goal)


class RecordingTwin:
    """A twin with made-up figures (a hash of the station, so the ascent wanders) that records every station the
    search asks it to predict, and whether the catalog accepts it (the simulator would raise on one it refuses)."""

    runs: tuple[str, ...] = ("r1",)
    origin = "prior profile (made up)"

    def __init__(self, engine: str):
        self.engine, self.asked, self.refused = engine, 0, []

    def predict(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                slos: dict[str, float] | None = None, native: tuple[int, float] | None = None) -> dict:
        self.asked += 1
        why = refusal(knobs, self.engine)
        if why is not None:
            self.refused.append(why)
        x = int(hashlib.sha256(repr(sorted(knobs.items())).encode()).hexdigest()[:8], 16) / 16 ** 8
        figure = 100.0 + 100.0 * x
        s = summary(n=n, whole=figure, native=figure, tpot=1.0)
        windows = {w: getattr(s, w).model_copy(update={"goodput": figure / 60}) for w in ("whole", "native")}
        return {"summary": s.model_copy(update=windows)}  # every objective a figure, goodput included

    def coefficients(self) -> dict:
        return {}


def _bests(goal: Any) -> list[dict[str, Any]]:
    """The start, then stations of the goal's space (from the start) that the catalog accepts, a seeded sample."""
    start, space = goal.start_station(), goal.space()
    points = [start | dict(zip(space, vs)) for vs in itertools.product(*space.values())]
    random.Random(0).shuffle(points)
    return [start] + [p for p in points if accepted(p, goal.engine)][:BESTS - 1]


@pytest.mark.parametrize("name", sorted(GOALS))
def test_every_station_the_twin_search_builds_is_one_the_catalog_accepts(name):
    goal = GOALS[name]
    twin = RecordingTwin(goal.engine)
    for best in _bests(goal):
        found = tw.search(History(goal_id="g", goal=goal, data_version="dv", best_knobs=best,
                                  budget_left_card_hours=100.0, experiments_left=10), twin, budget=COUNT)
        assert found is not None
    assert twin.asked > len(_bests(goal)), "the search built no neighbour at all"
    assert twin.refused == [], f"{len(twin.refused)} refused station(s), e.g. {twin.refused[0]}"


def test_the_demo_space_holds_stations_the_catalog_refuses_one_change_from_its_start():
    """The property above is not vacuous: one change from the demo's start (MTP k 3) turns speculation off."""
    start = GOALS["demo"].start_station()
    assert refusal(start | {"speculative_method": "none"}, "sim") == \
        "num_speculative_tokens: needs speculative_method != 'none' first"
    assert accepted(start | {"speculative_method": "none", "num_speculative_tokens": 0}, "sim")


class Raising:
    name, phase = "boom", "rank"

    def propose(self, asking) -> Proposals:
        raise RuntimeError("a station the model cannot handle")


def test_a_proposer_that_raises_yields_with_its_reason():
    got = asked(Raising(), None)  # type: ignore[arg-type]
    assert got.moves == [] and not got.lead()
    assert got.yields == "the boom proposer failed (RuntimeError: a station the model cannot handle), " \
                         "so it proposes nothing this time"


def test_a_proposer_that_raises_never_stops_the_goal_and_the_cards_say_why(monkeypatch):
    monkeypatch.setattr("agent.planner.proposers.PROPOSERS", (Raising(),) + PROPOSERS)
    ref = baseline(n=GOAL16.protocol.confirm_n)
    h = history([outcome(ref, summary(n=640, whole=180.0, native=180.0), "reference")])
    plan = DeterministicPlanner().ask(h)
    assert plan.card is not None and plan.card.change is not None, plan.stop_reason
    assert "the boom proposer failed (RuntimeError: a station the model cannot handle)" in (plan.card.note or "")
