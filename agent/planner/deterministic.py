"""The deterministic planner (the default; no LLM): history in, the next card or None out (ask/tell).

`ask` is a pipeline of named steps (`STEPS`), each a small function of one ask's reading of the history (`Asked`)
that answers a `Plan` or passes (None) to the next:
1. `spent`: no experiment left: only the confirm of a promising screen, with a person asked to extend the budget;
2. `reference`: the reference of the starting station at confirm N (screen N where only that is affordable);
3. `warm_reference`: its confirm-N reference while the start is warm, before the first move (a saving);
4. `recover`: a gain the goal cannot take as it is (agent/planner/recovery.py: a lost native window, a load gain
   that broke only a decode-side latency limit), kept before anything new;
5. `confirm_screen`: a promising screen confirmed (with a reference of its parent at confirm N first, so the
   comparison is like for like);
6. `rank`: the rank-phase proposers' moves from the best station, valued per card-hour and checked
   (agent/planner/ranking.py); the first worth a run (a hot one first while the best station is warm), or the
   leading model's "nothing left to gain";
7. `explore`: when nothing ranked is worth its cost, the explorer's card or the stop (agent/planner/stops.py).
Then `screen_reference`: a screened move of a best station confirmed at confirm N only needs that station's
screen-N reference first. None (a stop) means nothing left is worth its cost, or too many experiments in a row
changed nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from agent.planner.candidates import CandidateCard, direction_of, rule_for, station_hash, with_stage
from agent.planner.checks import budget_only, check
from agent.planner.diagnosis import Diagnosis, diagnose
from agent.planner.history import History
from agent.planner.pairs import pair_hypothesis
from agent.planner.plan import Plan, PlanRow
from agent.planner.proposers import Asking, of_phase
from agent.planner.proposers.guarded import asked
from agent.planner.protocol_cards import checked, confirm, extension_allowed, pending_confirm, reference_card
from agent.planner.ranking import Ranking, candidates, cheaper_direct, hot_while_warm, ranking, stale_streak, \
    worth_running
from agent.planner.rules.spec_acceptance import fitted_cost
from agent.planner.screens import to_confirm
from agent.planner.stops import explore_or_stop
from core.station import full_knobs  # the deployed station: catalog defaults filled in (the token budget)

DRAFT_COST_DIGITS = 4  # a fitted draft position's cost (relative to a decode step) is kept to 1/10000
REF_SCREEN_CONFIRM = 3  # screening a best confirmed at confirm N only: its screen-N reference, the screen, the confirm
SCREEN_CONFIRM = 2  # screening a best with its screen-N reference at hand: the screen and its confirm
_cheaper_direct = cheaper_direct  # read by tests under its former name
__all__ = ["STEPS", "Asked", "DeterministicPlanner", "candidates", "carry_diagnosis", "closes_hypothesis",
           "diagnosis_for", "ruled_out"]


def ruled_out(history: History) -> set[str]:
    """Hypotheses a valid negative from the best station has tested (the rule its move named)."""
    out: set[str] = set()
    for o in history.outcomes:
        if o.decision != "negative" or o.card.change is None or o.card.parent_knobs_hash != history.best_knobs_hash:
            continue
        if o.card.multi:  # a coupled pair tests its coupling, not either change's hypothesis alone
            out.add(pair_hypothesis(o.card))
            continue
        c = o.card.change
        rule = rule_for(c.knob, direction_of(c))
        if not rule.tradeoff:
            out.update(rule.hypotheses)
    return out


def closes_hypothesis(outcome: str, card: CandidateCard, history: History) -> str | None:
    """The hypothesis a valid negative from the best station closes (one no earlier negative from it had tested):
    a closed hypothesis is a changed decision (the diagnosis, and so the next move, changes). None otherwise."""
    c = card.change
    if outcome != "negative" or c is None or card.parent_knobs_hash != history.best_knobs_hash:
        return None
    if card.multi:
        h = pair_hypothesis(card)
        return h if h not in ruled_out(history) else None
    rule = rule_for(c.knob, direction_of(c))
    if rule.tradeoff:
        return None
    return next((h for h in rule.hypotheses if h not in ruled_out(history)), None)


def diagnosis_for(history: History) -> Diagnosis | None:
    """The diagnosis of the best station's latest valid run; computed once per History and kept with it."""
    if not history._diagnosed:
        history._diagnosis, history._diagnosed = _diagnose(history), True
    return history._diagnosis


def carry_diagnosis(history: History, state: dict) -> None:
    """Keep the diagnosis the graph state carries (the diagnose node's) with this History, so the planner reads
    that one even when the History was rebuilt after diagnose (a restart between the two nodes)."""
    if "diagnosis_data" in state and not history._diagnosed:
        data = state["diagnosis_data"]
        history._diagnosis = Diagnosis.model_validate(data) if data is not None else None
        history._diagnosed = True


def _diagnose(history: History) -> Diagnosis | None:
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None:
        return None
    knobs = full_knobs(history.best_knobs, history.goal.engine)
    d = diagnose(ref.summary, ref.evidence, history.goal.view().limits, knobs, ruled_out(history))
    fit = fitted_cost(history, history.best_knobs) if d.spec_positions is not None else None
    if fit is not None:  # the measured widths price a position (verification too), not the draft share alone
        d = d.model_copy(update={"draft_cost": round(fit[0], DRAFT_COST_DIGITS), "draft_cost_why": fit[1]})
    return d


@dataclass
class Asked:
    """One ask's reading of the history, shared by its steps; each figure is read when a step first needs it."""

    history: History
    ranking: Ranking | None = None  # the rank step's, which the explore step reads

    @property
    def diag(self) -> Diagnosis | None:
        return diagnosis_for(self.history)  # kept with the History: computed once

    @cached_property
    def at_confirm(self) -> bool:
        """The best station was confirmed at confirm N only (a recovery, a direct confirm): it is compared there,
        and its screen-N reference is measured only when a screen follows (`screen_reference`)."""
        return self.history.best_at_confirm_only()

    @cached_property
    def screen_ref(self) -> CandidateCard:
        """The best station's screen-N reference."""
        h = self.history
        return reference_card(h, h.best_knobs, h.goal.protocol.screen_n)

    @cached_property
    def direct(self) -> bool:
        """Every move goes to confirm N at once: too few experiments left for a reference, a screen and its confirm,
        or a person rejected the best station's screen-N reference."""
        h = self.history
        few = h.experiments_left < (REF_SCREEN_CONFIRM if self.at_confirm else SCREEN_CONFIRM) and (
            self.at_confirm or h.reference(h.best_knobs, h.goal.protocol.confirm_n) is not None)
        return few or (self.at_confirm and h.vetoed(self.screen_ref) is not None)

    @cached_property
    def left(self) -> str | None:
        """Why every move goes straight to confirm N (None: each move's own reason decides)."""
        return (f"{self.history.experiments_left} experiment(s) left cannot pay a reference, a screen and its "
                f"confirm") if self.direct else None

    @cached_property
    def stale(self) -> bool:
        """Too many valid experiments in a row changed nothing."""
        return stale_streak(self.history) >= self.history.goal.stop.max_without_improvement


Step = Callable[[Asked], "Plan | None"]


def spent(a: Asked) -> Plan | None:
    """No experiment left: the confirm of a promising screen where the goal lets a person extend the budget."""
    h = a.history
    if h.experiments_left >= 1:
        return None
    conf = pending_confirm(h) if extension_allowed(h) else None
    plan = confirm(conf, h, a.diag) if conf is not None else None  # asks a person to extend the budget
    return plan or Plan(card=None, stop_reason="experiment budget spent")


def reference(a: Asked) -> Plan | None:
    """The first reference runs at confirm N: every later comparison can use it (a confirm compares there, and its
    evidence is the longer run's), and the screen-N reference is measured only when a screen follows
    (`screen_reference`) — a first move that goes straight to confirm needs none."""
    h, protocol = a.history, a.history.goal.protocol
    if h.reference(h.best_knobs, protocol.screen_n) is not None or a.at_confirm:
        return None
    card = reference_card(h, h.best_knobs, protocol.confirm_n)
    refusals = check(card, h)
    if refusals and budget_only(refusals):  # a budget that pays a screen-N one
        card = with_stage(card, "baseline", protocol.screen_n)
    veto = h.vetoed(card)
    if veto is not None:
        return Plan(card=None, stop_reason=f"nothing left that was not rejected: the reference of the "
                                           f"starting station was {veto.how()}")
    return checked(card, h, None, "reference of the starting station")


def warm_reference(a: Asked) -> Plan | None:
    """The start is warm now and no move ran yet: its confirm-N reference costs a hot run, after the first move a
    restart. Optional: a saving, never a reason to stop."""
    h, protocol = a.history, a.history.goal.protocol
    if protocol.confirm_n == protocol.screen_n or any(o.card.stage != "baseline" for o in h.outcomes) \
            or h.reference(h.best_knobs, protocol.confirm_n) is not None \
            or h.warm_knobs is None or station_hash(h.warm_knobs) != h.best_knobs_hash:
        return None
    card = reference_card(h, h.best_knobs, protocol.confirm_n)
    if check(card, h):
        return None
    return checked(card, h, a.diag, f"reference of the starting station at N={card.n} while it is warm")


def recover(a: Asked) -> Plan | None:
    """A confirmed gain the goal cannot take as it is (the recover-phase proposers, in registry order), kept before
    anything new; a recovery a person rejected is passed over."""
    h = a.history
    ext = extension_allowed(h)
    for proposer in of_phase("recover"):
        for rec in asked(proposer, Asking(h, a.diag)).moves:
            if h.vetoed(rec.card) is None:
                return checked(rec.card, h, a.diag, rec.why, extension_ok=ext)
    return None


def confirm_screen(a: Asked) -> Plan | None:
    """The confirm of a promising screen (its parent's confirm-N reference first); None when none is pending or a
    person rejected that reference."""
    conf = pending_confirm(a.history)
    return confirm(conf, a.history, a.diag) if conf is not None else None


def rank(a: Asked) -> Plan | None:
    """The first ranked move worth a run, unless too many in a row changed nothing; a move the leading model (the
    twin) calls likely keeps its place (it ranked every move over the whole space, restarts priced in), else a hot
    move runs first while the best station is warm. The leading model's "nothing left to gain" stops the goal.
    None: the explore step decides."""
    h = a.history
    a.ranking = r = ranking(h, a.diag, a.left)
    if a.stale:
        return None
    chosen = worth_running(r.passing, r.leader)
    if chosen is not None:
        card, v = chosen
        hot = hot_while_warm(r.passing, h) if not r.leader.likely(card, v) else None
        if hot is not None and hot[0] is not card:
            card = hot[0]
            r.ranked.append(PlanRow.of(card.title(), hot[1].value, "runs first: a hot move on the warm best station; "
                                                         "after a restart elsewhere it would cost a restart too"))
        return Plan(card=card, diagnosis=a.diag, ranked=r.ranked, move=True)
    settled = r.leader.settled()  # the leading model, predicting the runs, searched the space: nothing left to gain
    return Plan(card=None, diagnosis=a.diag, ranked=r.ranked, stop_reason=settled) if settled else None


def explore(a: Asked) -> Plan:
    """The explorer's card, re-staged straight to confirm N where a screen cannot serve, or the stop."""
    h, r = a.history, a.ranking
    assert r is not None  # the rank step ran
    restage = (lambda c: to_confirm(c, h, a.left or "the best station has no screen-N "  # noqa: E731
                                    "reference to screen against")) if a.direct or a.at_confirm else None
    return explore_or_stop(h, a.diag, r.ranked, r.passing, a.stale, restage)


def screen_reference(a: Asked, plan: Plan) -> Plan | None:
    """A move screened from a best station confirmed at confirm N only: that station's screen-N reference runs
    first (the screen compares with it). None: the plan stands."""
    if not (a.at_confirm and plan.move and plan.card is not None and plan.card.stage == "screen"):
        return None
    ref = a.screen_ref
    return checked(ref, a.history, a.diag, f"reference of the best station at N={ref.n}: the screen compares with it")


STEPS: tuple[Step, ...] = (spent, reference, warm_reference, recover, confirm_screen, rank, explore)


class DeterministicPlanner:
    name = "deterministic"

    def ask(self, history: History) -> Plan:
        """The first plan a step answers, in STEPS order (`explore` always answers), then `screen_reference`."""
        asked_ = Asked(history)
        plan = next(p for p in (step(asked_) for step in STEPS) if p is not None)
        return screen_reference(asked_, plan) or plan
