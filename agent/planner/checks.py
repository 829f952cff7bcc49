"""The same deterministic checks for every proposal, whoever wrote it (rules, the explorer or an LLM): among them
that no card raises a cap the evidence shows does not bind (agent/planner/inert.py), and that no card removes
instances its parent's run shows the goal's cards contract needs (`cards_refusal`).

Each check returns a refusal (agent/planner/refusals.py: its kind and words) or nothing; a card passes when the
list is empty.
"""
from __future__ import annotations

from typing import Any

from agent.planner.candidates import CandidateCard, Change
from agent.planner.history import History
from agent.planner.inert import inert_refusal
from agent.planner.refusals import Refusal, RefusalKind, budget_only, said  # noqa: F401 (budget_only, said: the planner's)
from core.canonical import canon
from core.knobs import (COST_ORDER, DECODE_INSTANCES, PREFILL_INSTANCES, KnobError, KnobErrorKind, catalog,
                        drafts_nothing, role_of)
from core.station import change_cost

MAX_ATTEMPTS = 3  # runs of one experiment that may end in a tooling fault before it is set aside


def with_attempt(card: CandidateCard, history: History) -> CandidateCard:
    """The card as its next attempt: a fault is retried as a fresh run of the same experiment, never a dead end."""
    return card.model_copy(update={"attempt": history.faulted(card.experiment_key) + 1})


def _eq(a: Any, b: Any) -> bool:
    return canon(a) == canon(b)


def estimate(card: CandidateCard, history: History) -> float:
    """Card-hours this card would cost; a restart only when the warm service runs another server config."""

    cost = change_cost(history.warm_knobs, card.knobs)
    needs = cost is not None and cost != "hot"
    cls = card.cost_class if card.change is not None else (cost or "hot")
    return history.cost.estimate(cls, card.n, history.goal.protocol.warmup, needs_restart=needs)


def check(card: CandidateCard, history: History) -> list[Refusal]:
    """Refusals for this card; empty = accepted."""
    out: list[Refusal] = []
    goal = history.goal
    cat = catalog()
    if card.goal_id != history.goal_id or card.scenario != goal.scenario:
        out.append(Refusal(RefusalKind.GOAL, f"card is for {card.goal_id}/{card.scenario}, not {history.goal_id}/{goal.scenario}"))
    if card.change is None:
        if card.stage != "baseline":
            out.append(Refusal(RefusalKind.ONE_CHANGE, "a screen or confirm card must change exactly one knob"))
    else:
        diff = {k for k in set(card.knobs) | set(card.parent_knobs)
                if not _eq(card.knobs.get(k), card.parent_knobs.get(k))}
        named = {c.knob for c in card.changes}
        if not card.multi and len(diff) != 1:
            out.append(Refusal(RefusalKind.ONE_CHANGE, f"{len(diff)} knobs differ from the parent ({sorted(diff)})"))
        elif card.multi and (diff != named or len(named) != len(card.changes)):
            what = "a coupled pair must change its two knobs" if len(card.changes) == 2 else \
                f"a jump of {len(card.changes)} changes must change its {len(card.changes)} knobs"
            out.append(Refusal(RefusalKind.ONE_CHANGE, f"{what}, {sorted(diff)} differ"))
        if card.multi and not card.coupling:
            out.append(Refusal(RefusalKind.ONE_CHANGE, "a second change needs the coupling the evidence names"))
        if card.more and card.also is None:
            out.append(Refusal(RefusalKind.ONE_CHANGE, "a jump names its second change first (`also`)"))
        risky = False
        for c in card.changes:
            found = _change_refusals(c, card, history)
            out += found
            if c.knob not in cat:  # no further check can read a knob the catalog does not know
                return out
            risky = risky or catalog().get(c.knob).quality_risk
        try:
            cat.validate(dict(card.knobs), engine=goal.engine)
        except KnobError as e:
            if e.kind is KnobErrorKind.DEPENDENCY:
                out.append(Refusal(RefusalKind.DEPENDENCIES, str(e)))
            elif not any(x.kind is RefusalKind.IN_RANGE for x in out):
                out.append(Refusal(RefusalKind.IN_RANGE, str(e)))
        nothing = drafts_nothing(cat.defaults(goal.engine) | dict(card.knobs), cat)  # vLLM refuses it at start
        if nothing is not None:
            out.append(Refusal(RefusalKind.DEPENDENCIES, str(nothing)))
        for c in card.changes:
            out += _negatives(c, card, history)
        inert = inert_refusal(card, history)  # a cap the evidence shows does not bind, raised (agent/planner/inert.py)
        if inert is not None:
            out.append(inert)
        short = cards_refusal(card, history)
        if short is not None:
            out.append(short)
        failed = history.quality_failed(card.knobs)
        if failed is not None:
            out.append(failed.refusal())
        if card.station_key in history.predicted_negatives:  # set aside unrun (any stage): a prediction, not a result
            out.append(Refusal(RefusalKind.PREDICTED_NEGATIVE, history.predicted_negatives[card.station_key]))
        if card.stage == "screen" and card.parent_knobs_hash != history.best_knobs_hash:
            out.append(Refusal(RefusalKind.PARENT, "a screen starts from the current best station"))
        if card.quality_risk != risky:
            out.append(Refusal(RefusalKind.QUALITY_RISK, f"{' + '.join(sorted(named))} quality risk is {risky}"))
        worst = max((catalog().get(c.knob).cost_class for c in card.changes), key=COST_ORDER.__getitem__)
        if card.multi and card.cost_class != worst:
            what = "a coupled pair costs its dearer" if len(card.changes) == 2 else "a jump costs its dearest"
            out.append(Refusal(RefusalKind.COST_CLASS, f"{what} change's class ({worst}), not {card.cost_class}"))
    if card.stage == "screen" and card.n != goal.protocol.screen_n:
        out.append(Refusal(RefusalKind.PROTOCOL, f"screen N must be {goal.protocol.screen_n}, not {card.n}"))
    if card.stage == "confirm" and card.n != goal.protocol.confirm_n:
        out.append(Refusal(RefusalKind.PROTOCOL, f"confirm N must be {goal.protocol.confirm_n}, not {card.n}"))
    veto = history.vetoed(card)
    if veto is not None:
        out.append(veto.refusal())
    known = history.reference(card.knobs, card.n) if card.stage != "baseline" else None
    if known is not None:  # e.g. a move back to the parent: its measurement at this N is reused, not repeated
        out.append(Refusal(RefusalKind.MEASURED, f"this station was measured at N={card.n} already ({known.run_id})"))
    elif card.stage == "screen" and card.n < goal.protocol.confirm_n:
        # a screen asks whether a confirm is worth running; where the confirm's N measured this station, the answer
        # is in (a negative there is one whatever its screen would read, a positive made it the best station)
        larger = history.reference(card.knobs, goal.protocol.confirm_n)
        if larger is not None:
            out.append(Refusal(RefusalKind.MEASURED,
                               f"this station was measured at the confirm N={goal.protocol.confirm_n} already "
                               f"({larger.run_id}): a screen at N={card.n} answers nothing that run did not"))
    if card.experiment_key in history.finished_keys:
        out.append(Refusal(RefusalKind.NOT_FINISHED, f"experiment {card.experiment_key} already ran"))
    elif history.faulted(card.experiment_key) >= MAX_ATTEMPTS:
        out.append(Refusal(RefusalKind.FAULTS, f"experiment {card.experiment_key} ended in a tooling fault "
                                              f"{MAX_ATTEMPTS} times; a person should look at the target"))
    if history.experiments_left < 1:
        out.append(Refusal(RefusalKind.AFFORDABLE, "no experiments left in the budget"))
    cost = estimate(card, history)
    if cost > history.budget_left_card_hours:
        out.append(Refusal(RefusalKind.AFFORDABLE, f"~{cost:.2f} card-h estimated, {history.budget_left_card_hours:.2f} left"))
    return out


def _change_refusals(c: Change, card: CandidateCard, history: History) -> list[Refusal]:
    """The checks of one change of a card (both of a coupled pair's): the knob, its range, its old value, and the
    known negatives under the same conditions."""
    out: list[Refusal] = []
    goal, cat = history.goal, catalog()
    if c.knob not in cat:
        return [Refusal(RefusalKind.KNOB_EXISTS, f"{c.knob!r} is not in the knob catalog")]
    knob = cat.get(c.knob)
    if goal.engine not in knob.engines and knob.cost_class != "hot":
        out.append(Refusal(RefusalKind.KNOB_EXISTS, f"{c.knob} is not a knob of engine {goal.engine!r}"))
    try:
        knob.coerce(c.new)
    except KnobError as e:
        out.append(Refusal(RefusalKind.IN_RANGE, str(e)))
    space = goal.space()
    if c.knob not in space:
        out.append(Refusal(RefusalKind.IN_RANGE, f"{c.knob} is not in the goal's search space"))
    elif not any(_eq(c.new, v) for v in space[c.knob]):
        out.append(Refusal(RefusalKind.IN_RANGE, f"{c.knob}={c.new!r} is not one of the goal's values {list(space[c.knob])}"))
    if not _eq(c.old, card.parent_knobs.get(c.knob, knob.default)):
        out.append(Refusal(RefusalKind.ONE_CHANGE, f"old value {c.old!r} is not the parent's {card.parent_knobs.get(c.knob)!r}"))
    return out


def _negatives(c: Change, card: CandidateCard, history: History) -> list[Refusal]:
    """A known negative of this change under the same conditions (a pair with one in it is refused too)."""
    return [Refusal(RefusalKind.KNOWN_NEGATIVE, f"{c.knob}={c.new!r} was negative under the same conditions "
                                               f"({neg.experiment_key}: {neg.reason})") for neg in history.negatives
            if card.stage == "screen" and neg.applies(c.knob, c.new, card.scenario, history.data_version,
                                                      card.parent_knobs_hash, history.source_identity)]


def retry_note(card: CandidateCard, history: History) -> str | None:
    """When a change was negative under other conditions, say which changed (a retry is then allowed)."""
    if card.change is None:
        return None
    for neg in history.negatives:
        if neg.knob == card.change.knob and _eq(neg.value, card.change.new):
            changed = [name for name, a, b in (
                ("parent station", neg.parent_knobs_hash, card.parent_knobs_hash),
                ("data version", neg.data_version, history.data_version),
                ("source identity", neg.source_identity, history.source_identity),
                ("scenario", neg.scenario, card.scenario)) if a != b]
            if changed:
                return f"retrying a negative ({neg.experiment_key}): {', '.join(changed)} changed"
    return None


INSTANCE_ROLES = {PREFILL_INSTANCES: "prefill", DECODE_INSTANCES: "decode"}


def cards_refusal(card: CandidateCard, history: History) -> Refusal | None:
    """The goal's cards contract, read off the parent's own run: a card that only removes instances (of one role or
    both, nothing else re-laid) from a station whose run used `cards` cards, where the goal requires more than
    `cards` minus the instances removed (every instance holds at least one card), would run on fewer cards than the
    goal requires: an invalid run (cards_missing) by construction. Only where the run's own scrapes counted the
    role's instances at the knob's old value (the knob is that role's instance count on this deployment); without
    those figures nothing is refused."""
    required = history.goal.constraints.cards
    ref = history.latest_valid(card.parent_knobs)
    if required is None or ref is None or ref.summary is None:
        return None
    removed = 0
    for c in card.changes:
        role = role_of(c.knob)
        if role not in INSTANCE_ROLES:
            if catalog().get(c.knob).cost_class == "topology":
                return None  # another layout change: the cards it adds are not known here
            continue
        counted = getattr(ref.evidence, f"{INSTANCE_ROLES[role]}_instances")
        try:
            old, new = int(c.old), int(c.new)
        except (TypeError, ValueError):
            return None
        if counted is None or counted != old or new > old:
            return None  # the run did not count this role at the old value, or the card adds instances
        removed += old - new
    if removed and ref.summary.cards - removed < required:
        return Refusal(RefusalKind.CARDS, f"{card.title()} removes {removed} instance(s) from a station whose run "
                                          f"({ref.run_id}) used {ref.summary.cards} card(s); the goal requires "
                                          f"{required}, so the run would be invalid (cards_missing)")
    return None
