"""How a person's instructions meet the loop's own work (issue 44): an instruction never overrides a person.

A pause, stop or restore given while a card waits for a person takes effect after that decision; "one more round
at C90" is measured against a reference at its own N (measured first when there is none), and once its screen
and confirm ran the rounds left are the planner's; a round counts only experiments proposed for it, never a
card that waited for a person before the instruction was given.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.loop.record import OPEN_STATUSES
from agent.planner import (CandidateCard, Change, History, RefusalKind, build_card, check, direction_of,
                           estimate, said)
from state.lifecycle import STARTED, GoalStatus

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

# what a person's say-so covers: the budget, and what the loop would not repeat by itself (a known negative, an
# earlier veto, a prediction)
SAID_SO = frozenset({RefusalKind.AFFORDABLE, RefusalKind.KNOWN_NEGATIVE, RefusalKind.REJECTED,
                     RefusalKind.PREDICTED_NEGATIVE})


def started(store: Store, goal_id: str, cand: Any) -> bool:
    """The card's experiment was launched (it runs, failed, is unknown, or has a run)."""
    return cand.status in STARTED or any(r.candidate_id == cand.id for r in store.runs(goal_id))


def awaiting_person(store: Store, goal_id: str) -> bool:
    """The goal waits for a person: a card asked about and not decided, or a budget extension."""
    goal = store.get_goal(goal_id)
    if goal.status != GoalStatus.WAITING:
        return False
    if goal.waits_for_extension:
        return True
    return any(c.status in OPEN_STATUSES and store.approval(c.id) is None and not started(store, goal_id, c)
               for c in store.candidates(goal_id))


def counts_as_round(ins: Any, cand: Any) -> bool:
    """A round at C90 counts the experiments at C90 and, once they ran, the planner's changes after it (never a
    reference measured for it); a plain round, any experiment proposed after the instruction."""
    if cand is None:
        return False
    if ins.knobs:
        changed = bool(cand.card.get("change") or cand.card.get("knob"))
        return changed and (cand.card.get("planner") == "instruction" or _after(cand.created_at, ins.created_at))
    return _after(cand.created_at, ins.created_at)


def _after(a: datetime, b: datetime) -> bool:
    """a >= b, comparing naive and aware datetimes as the store hands them back (SQLite drops the zone)."""
    if a.tzinfo is None or b.tzinfo is None:
        a, b = a.replace(tzinfo=None), b.replace(tzinfo=None)
    return a >= b


def instructed_card(store: Store, goal_id: str, history: History) -> tuple[CandidateCard | None, str]:
    """"One more round at C90": that one change from the best station, screened or confirmed as the protocol
    says, after the reference it is judged against when that was never measured at its N; (None, why) when it
    cannot run (the loop stops and says so rather than run something else); (None, "") once its screen and
    confirm both ran (the rounds left are the planner's)."""
    ins = store.current_instruction(goal_id)
    knob, value = next(iter(sorted(ins.knobs.items())))
    proto = history.goal.protocol
    old = history.best_knobs.get(knob)
    direction = direction_of(Change(knob=knob, old=old, new=value)) if knob in history.goal.space() else "up"
    why: list[str] = []
    blocked = False  # a reason other than "already ran": the round cannot be carried out
    for stage, n in (("screen", proto.screen_n), ("confirm", proto.confirm_n)):
        if stage == "screen" and history.best_at_confirm_only():
            continue  # the best station was measured at confirm N only: the comparison that exists is there
        card = build_card(goal_id, history.goal.scenario, history.best_knobs, knob, value, stage=stage, n=n,
                          direction=direction, planner="instruction", note=f"instruction {ins.id} by {ins.who}")
        if card.experiment_key in history.finished_keys:
            why.append(f"the {stage} of {knob}={value!r} from the best station already ran")
            continue
        if history.reference(history.best_knobs, n) is None:
            # a round is judged against its parent at the same N: measure that reference first (once)
            ref = build_card(goal_id, history.goal.scenario, history.best_knobs, None, None, stage="baseline", n=n,
                             planner="instruction",
                             note=f"the reference at N={n} for instruction {ins.id} by {ins.who}, measured first")
            if ref.experiment_key in history.finished_keys:
                why.append(f"no valid reference of the best station at N={n} (its measurement ran and was not "
                           "valid): the round could not be judged")
                blocked = True
                break
            return ref.model_copy(update={"est_card_hours": round(estimate(ref, history), 4)}), ""
        # a person's say-so (SAID_SO); never a card that breaks the protocol or the search space
        refusals = [r for r in check(card, history) if r.kind not in SAID_SO]
        if not refusals:
            overridden = [r for r in check(card, history) if r.kind in SAID_SO - {RefusalKind.AFFORDABLE}]
            note = card.note + ("; run although " + said(overridden) if overridden else "")
            return card.model_copy(update={"est_card_hours": round(estimate(card, history), 4), "note": note}), ""
        why.append(f"{card.title()}: " + said(refusals))
        blocked = True
        break
    if not blocked:
        return None, ""  # its screen and confirm ran: the rounds left are the planner's, counted all the same
    return None, f"instruction {ins.id} by {ins.who} cannot be carried out: " + "; ".join(why)
