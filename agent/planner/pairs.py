"""Coupled-pair cards: two changes moved together, only where the evidence names the coupling between them.

One change stays the rule (docs/glossary.md). A pair is proposed when the best station's own evidence shows that
either change alone cannot win: the client cannot fill a larger batch (C per decode instance no more than the
batch limit) while the decode batch sits at its limit (raising max_num_seqs alone starves, raising C alone only queues: move both); the sender's rate and its
concurrency cap bind together (QPS ≈ r and in flight ≈ C: either alone is held by the other); or the acceptance
model values a wider draft while the decode batch is held at its limit or by TPOT (a wider draft raises tokens per
step and lowers TPOT per token: the decode batch must move with it). Load pairs need TPOT headroom (10 %, or a
fitted TPOT line that gives the step a fair chance: agent/planner/rules/load_headroom.py); once the line exists it sizes
the pair's step (C + max_num_seqs along the line; a wider draft's max_num_seqs along the line scaled by the
acceptance model: agent/planner/tpot_fit.py sized_pair, sized_draft_batch), and the one-step pair stays at 0.8 of its
value. The card names that coupling and its
evidence (`coupling`), costs its dearer change's class, and passes the same checks as a one-change card (a known
negative or a veto of either change refuses the pair; its parent is the best station). The explorer's pair
(agent/planner/proposers/explorer.py) comes from the same builder.
"""
from __future__ import annotations

import math
from typing import Any

from agent.planner.candidates import CandidateCard, Change, build_card, neighbours, rule_for
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import estimate, retry_note
from agent.planner.diagnosis import LOAD_HEADROOM, Diagnosis
from agent.planner.history import History
from agent.planner.rules.base import MoveRule, decode_at_limit
from agent.planner.rules.load_headroom import room_for
from agent.planner.rules.spec_acceptance import DEFAULT_DRAFT_COST, predicted_gain
from agent.planner.tpot_fit import line_limit, sized_draft_batch, sized_pair
from agent.planner.value import VALUE_DIGITS, Value, value_of
from core.knobs import ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, COST_ORDER, DRAFT_WIDTH, by_role, catalog, named, role_of

SIZED_STEP_DISCOUNT = 0.8  # the one-step move (or pair) when the evidence sizes a bigger one: less of the gap
HELD_ALONE = 0.25  # one change of a coupling the evidence says holds it back alone (as client_supply's NOT_BINDING)
COUPLED = 0.5  # a pair's confidence floor: both facts of its coupling were measured at the best station (= open)
IN_FLIGHT_FULL = 0.9  # achieved concurrency at least this share of C: the sender keeps every slot full
RATE_BOUND = 0.9  # QPS at least this share of r: the arrival rate binds


def pair_hypothesis(card: CandidateCard) -> str:
    """What a coupled pair's negative rules out: the coupling it tested (not either change's hypothesis alone)."""
    return f"{card.hypothesis or 'exploration'} (coupled {' + '.join(c.knob for c in card.changes)})"


def build_pair(history: History, first: tuple[str, Any], second: tuple[str, Any], *, coupling: str,
               stage: str = "screen", n: int | None = None, planner: str = "deterministic",
               **over: Any) -> CandidateCard:
    """A card for two changes of the best station moved together, saying which coupling and evidence call for it."""
    goal, parent = history.goal, history.best_knobs
    (k1, v1), (k2, v2) = first, second
    d1, d2 = catalog().get(k1), catalog().get(k2)
    fields: dict[str, Any] = dict(
        mechanism=(f"{rule_for(k1, move_direction(k1, parent, v1)).mechanism}; "
                   f"{rule_for(k2, move_direction(k2, parent, v2)).mechanism}"),
        decision=f"whether {k1} and {k2} moved together lift the objective where neither alone can",
        expected_effect=f"higher {goal.objective.metric} from both levers at once",
        negative_rules_out=f"the coupling of {k1} and {k2} from this station (each change alone stays open)")
    fields.update(over)
    return build_card(history.goal_id, goal.scenario, parent, k1, v1, stage=stage,  # type: ignore[arg-type]
                      n=goal.protocol.screen_n if n is None else n, planner=planner,
                      also=Change(knob=k2, old=parent.get(k2, d2.default), new=v2), coupling=coupling,
                      cost_class=max(d1.cost_class, d2.cost_class, key=COST_ORDER.__getitem__),
                      quality_risk=d1.quality_risk or d2.quality_risk, **fields)


def build_jump(history: History, changes: list[tuple[str, Any]], *, coupling: str, mechanism: str,
               stage: str = "screen", n: int | None = None, **over: Any) -> CandidateCard:
    """A card for three or more changes of the best station moved at once (the twin's jump to its optimum): the
    first two as a pair's, the rest in `more`, costing its dearest change's class, every change named; the caller
    says the mechanism that moves them together."""
    if len(changes) <= 2:  # two changes are a pair's card (build_pair)
        raise ValueError(f"a jump has three changes or more, not {len(changes)}")
    parent = history.best_knobs
    card = build_pair(history, changes[0], changes[1], coupling=coupling, mechanism=mechanism, stage=stage, n=n,
                      **over)
    rest = tuple(Change(knob=k, old=parent.get(k, catalog().get(k).default), new=v) for k, v in changes[2:])
    defs = [catalog().get(k) for k, _ in changes]
    return card.model_copy(update={
        "more": rest, "cost_class": max((d.cost_class for d in defs), key=COST_ORDER.__getitem__),
        "quality_risk": any(d.quality_risk for d in defs)})


def move_direction(knob: str, parent: dict[str, Any], new: Any) -> str:
    d = catalog().get(knob)
    return next((dr for dr, _ in neighbours(knob, parent.get(knob, d.default), [new])), "up")


def _knob(history: History, role: str) -> str | None:
    """The knob playing `role` at the best station, else in the goal's space (None: neither has one)."""
    return named(role, history.best_knobs) or named(role, history.goal.space())


def _up(history: History, knob: str | None) -> Any:
    if knob is None:
        return None
    values = history.goal.space().get(knob)
    if not values:
        return None
    cur = history.best_knobs.get(knob, catalog().get(knob).default if knob in catalog() else None)
    return next((v for d, v in neighbours(knob, cur, list(values)) if d == "up"), None)


def couplings(history: History, diag: Diagnosis | None) -> list[tuple[str, str, str, str]]:
    """The couplings the best station's latest evidence names: (knob, knob, hypothesis, the evidence in words).
    The client ones are exclusive (each change alone is held by the other); a wider draft alone may still gain."""
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None or diag is None:
        return []
    s, ev = ref.summary, ref.evidence
    win = s.native or s.whole
    out: list[tuple[str, str, str, str]] = []
    full = win is not None and bool(s.concurrency) and win.achieved_concurrency is not None \
        and win.achieved_concurrency >= IN_FLIGHT_FULL * s.concurrency
    at_limit = decode_at_limit(ev)
    head = diag.headroom
    room = head is None or head >= LOAD_HEADROOM  # more in flight and a bigger batch raise TPOT: room for both
    # the station's C (what the pair changes): per decode instance no more than the batch limit, a larger batch
    # cannot be filled by this client
    kc, ks, kr = _knob(history, CLIENT_CAP), _knob(history, BATCH_CAP), _knob(history, ARRIVAL_RATE)
    c, limit, inst = by_role(history.best_knobs, CLIENT_CAP), ev.decode_batch_limit, ev.decode_instances
    # under 10 % headroom the TPOT line fitted from the runs made may still give the step a fair chance
    # (a role no knob plays is left out of the target: its readers find no value either way)
    fit, line = room_for(history, head, history.best_knobs | {k: _up(history, k) for k in (kc, ks) if k is not None})
    # a coupling whose knob is in neither the station nor the space is left out: it has no step up (coupled skips it)
    if at_limit and fit and isinstance(c, (int, float)) and limit and c / (inst or 1.0) <= limit \
            and kc is not None and ks is not None:
        out.append((kc, ks, "client_supply",
                    f"decode batch at its limit (running {ev.decode_running_max:.0f} of {limit:.0f}) and the "
                    f"client cannot fill a larger batch (C={c:g} over {inst or 1.0:.0f} decode instance(s) is no more "
                    f"than the limit): raising {ks} alone starves, raising C alone queues; move both"
                    + (f" ({line})" if line else "")))
    r = s.request_rate
    if full and room and r and math.isfinite(r) and win.qps >= RATE_BOUND * r and kc is not None and kr is not None:
        out.append((kc, kr, "client_supply",
                    f"the sender's rate and its cap bind together (QPS {win.qps:.2f} of r={r:g}, in flight "
                    f"{win.achieved_concurrency:.1f} of C={s.concurrency}): either raised alone is held by the "
                    f"other; move both"))
    kd = _knob(history, DRAFT_WIDTH)
    k = int(by_role(history.best_knobs, DRAFT_WIDTH) or 0)
    k_up = _up(history, kd)
    if diag.spec_positions is not None and k > 0 and k_up is not None and ks is not None and (at_limit or (
            head is not None and head < LOAD_HEADROOM)):
        cost = DEFAULT_DRAFT_COST if diag.draft_cost is None else diag.draft_cost
        g = predicted_gain(diag.spec_positions, k, int(k_up), cost)
        held = "at its limit" if at_limit else f"by its latency limit ({head:.0%} headroom)"
        if g > 0:
            out.append((kd, ks, "spec_acceptance",
                        f"the acceptance model values k {k} -> {k_up} at {g:+.1%} and the decode batch is held {held}: "
                        f"a wider draft raises tokens per step, so the decode batch must change with it"))
    return out


def pair_moves(history: History, diag: Diagnosis | None,
               restart: float) -> tuple[list[tuple[CandidateCard, Value]], dict[tuple[str, str], str]]:
    """The rule-sourced pair cards from the best station, valued (unchecked): each change one step up (or the step
    the TPOT line sizes); and the one-change moves an exclusive coupling holds back alone ((knob, repr(value)) ->
    why), which the planner values at HELD_ALONE of what they were (the pair runs first; each alone stays open)."""
    out = []
    held: dict[tuple[str, str], str] = {}
    space = history.goal.space()
    for k1, k2, hyp, why in couplings(history, diag):
        v1, v2 = _up(history, k1), _up(history, k2)
        if v1 is None or v2 is None:
            continue
        if hyp == "client_supply":
            held.update({(k1, repr(v1)): why, (k2, repr(v2)): why})
        steps: list[tuple[Any, Any, str, str | None]] = [(v1, v2, why, None)]
        roles = (role_of(k1), role_of(k2))
        if roles == (CLIENT_CAP, BATCH_CAP):  # the line sizes the pair's step once two batches are known
            jump = sized_pair(history, list(space.get(k1) or []), list(space.get(k2) or []), line_limit(history))
            if jump is not None:
                steps.insert(0, (jump[0], jump[1], f"{why}; {jump[2]}", jump[2]))
        if roles == (DRAFT_WIDTH, BATCH_CAP) and diag is not None and diag.spec_positions:
            # tokens per step over step time at the new width: TPOT scales by the inverse of the predicted gain
            cost = DEFAULT_DRAFT_COST if diag.draft_cost is None else diag.draft_cost
            g = predicted_gain(diag.spec_positions, int(history.best_knobs.get(k1) or 0), int(v1), cost)
            jump = sized_draft_batch(history, list(space.get(k2) or []), 1.0 / (1.0 + g),
                                     f"k {history.best_knobs.get(k1)} -> {v1} at {g:+.1%} decode throughput",
                                     line_limit(history)) if g > -1.0 else None
            if jump is not None:
                steps.insert(0, (v1, jump[0], f"{why}; {jump[1]}", jump[1]))
        r1, r2 = rule_for(k1, "up"), rule_for(k2, "up")
        for n1, n2, words, sized in steps:
            over = {"expected_effect": sized} if sized else {}
            card = build_pair(history, (k1, n1), (k2, n2), coupling=words, hypothesis=hyp, **over)
            cost = estimate(card, history)
            # as sure as the strongest hypothesis either move tests (the coupling's own among them)
            rule = MoveRule(hypotheses=(hyp, *r1.hypotheses, *r2.hypotheses), gain=r1.gain, mechanism=card.mechanism)
            v = value_of(card, rule, diag, cost, history.budget_left_card_hours, restart_card_hours=restart,
                         extra_gain=r2.gain, min_confidence=COUPLED)  # both levers move when the coupling holds
            v = v.model_copy(update={"why": v.why + f"; coupled pair: {words}"})
            if len(steps) > 1 and sized is None:  # the one-step pair when the line sizes a bigger one
                v = v.model_copy(update={"value": round(v.value * SIZED_STEP_DISCOUNT, VALUE_DIGITS),
                                         "why": v.why + f"; the TPOT line sizes a jump to {k1}={steps[0][0]}, "
                                                        f"{k2}={steps[0][1]} instead"})
            out.append((card.model_copy(update={"score": v.value, "est_card_hours": round(cost, CARD_HOURS_DIGITS),
                                                "note": retry_note(card, history)}), v))
    return out, held


def hold(card: CandidateCard, v: Value, held: dict[tuple[str, str], str]) -> tuple[CandidateCard, Value]:
    """A one-change move a coupling holds back alone, valued at HELD_ALONE of what it was; any other unchanged."""
    why = held.get((card.change.knob, repr(card.change.new))) if card.change is not None and not card.multi \
        else None
    if why is None:
        return card, v
    v = v.model_copy(update={"value": round(v.value * HELD_ALONE, VALUE_DIGITS),
                             "why": v.why + f" × {HELD_ALONE} (held alone: {why})"})
    return card.model_copy(update={"score": v.value}), v
