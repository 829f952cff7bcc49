"""Proposers behind one interface (agent/planner/proposers/): a new proposer is one module and one registry line,
and what it returns is ranked by the same value per card-hour and passes the same checks as every other card."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

from agent.planner import proposers
from agent.planner.candidates import build_card
from agent.planner.checks import estimate
from agent.planner.deterministic import DeterministicPlanner, candidates, diagnosis_for
from agent.planner.proposers import PHASES, PROPOSERS, Asking, Proposals, Proposed, Proposer, of_phase
from agent.planner.rules.base import MoveRule
from agent.planner.value import value_of
from tests.rules_support import measured_start


def defined_proposers() -> set[type]:
    """Every proposer class a module under agent/planner/proposers/ defines (a subclass of the base)."""
    out = set()
    for m in pkgutil.iter_modules(proposers.__path__):
        mod = importlib.import_module(f"{proposers.__name__}.{m.name}")
        out |= {c for _, c in inspect.getmembers(mod, inspect.isclass)
                if issubclass(c, Proposer) and c is not Proposer and c.__module__ == mod.__name__}
    return out


def test_every_proposer_is_registered_once_with_its_phase():
    names = [p.name for p in PROPOSERS]
    assert all(names) and len(names) == len(set(names))
    assert all(p.phase in PHASES for p in PROPOSERS) and all(of_phase(ph) for ph in PHASES)
    assert sum(len(of_phase(ph)) for ph in PHASES) == len(PROPOSERS)
    # a module under proposers/ that defines a proposer has it in the registry (one line there, nothing else)
    assert defined_proposers() == {type(p) for p in PROPOSERS}


class OneMove(Proposer):
    """A proposer of one change, valued by the same value model as the rules' moves (a strong prior gain)."""

    name, phase = "one_move", "rank"

    def __init__(self, knob: str, new, gain: float = 0.6):
        self.knob, self.new, self.gain = knob, new, gain

    def propose(self, asking: Asking) -> Proposals:
        h = asking.history
        card = build_card(h.goal_id, h.goal.scenario, h.best_knobs, self.knob, self.new, stage="screen",
                          n=h.goal.protocol.screen_n, direction="up")
        cost = estimate(card, h)
        v = value_of(card, MoveRule(gain=self.gain, mechanism="a test's own proposer"), asking.diag, cost,
                     h.budget_left_card_hours, restart_card_hours=asking.restart)
        v = v.model_copy(update={"why": v.why + "; proposed by one_move"})
        return Proposals(moves=[Proposed(card.model_copy(update={"score": v.value}), v)])


def test_a_new_proposer_is_one_registry_line_and_its_move_is_ranked_and_checked_like_the_rest(tmp_path, monkeypatch):
    h = measured_start(tmp_path, "llama70b-h100-decode-bound")
    diag = diagnosis_for(h)
    before = candidates(h, diag)
    space = h.goal.space()
    knob = next(k for k in space if k != "concurrency" and len(space[k]) > 1 and h.best_knobs.get(k) != space[k][-1])
    mine = OneMove(knob, space[knob][-1])
    monkeypatch.setattr(proposers, "PROPOSERS", PROPOSERS + (mine,))  # its registry line
    after = candidates(h, diag)
    ours = [(c, v) for c, v in after if v.why.endswith("proposed by one_move")]
    assert len(ours) == 1 and len(after) == len(before) + 1
    card, v = ours[0]
    # ranked among the others by the one value per card-hour: everything above it is worth more
    assert all(o.value >= v.value for _, o in after[:after.index(ours[0])])
    assert all(o.value <= v.value for _, o in after[after.index(ours[0]) + 1:])
    # and checked like the rest: a value outside the goal's space is refused, with the check's reason
    monkeypatch.setattr(proposers, "PROPOSERS", PROPOSERS + (OneMove(knob, -7, gain=50.0),))
    plan = DeterministicPlanner().ask(h.model_copy(update={"warm_knobs": None}))  # past its warm reference
    refused = [r for r in plan.ranked if f"{knob} " in r.title and "-7" in r.title]
    assert refused and "in_range" in refused[0].why
    assert plan.card is None or plan.card.change is None or plan.card.change.new != -7
    # the same proposer with a move worth more than every rule's runs it (through the checks, into the plan)
    monkeypatch.setattr(proposers, "PROPOSERS", PROPOSERS + (OneMove(knob, space[knob][-1], gain=50.0),))
    plan = DeterministicPlanner().ask(h.model_copy(update={"warm_knobs": None}))
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.new) == (knob, space[knob][-1])
