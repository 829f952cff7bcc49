"""The protocol's cards, not chosen moves: references (a station measured at an N to compare with) and the confirm of
a promising screen, each through the same checks as every card; a budget the card cannot pay is asked of a person
where the goal's authorisation allows (`budget_extension`), else it stops the goal and says why."""
from __future__ import annotations

from agent.planner.candidates import CandidateCard, build_card, with_stage
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import budget_only, check, estimate, said
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from agent.planner.plan import Plan, PlanRow


def reference_card(history: History, knobs: dict, n: int) -> CandidateCard:
    """The reference of a station at N (no change: a baseline)."""
    return build_card(history.goal_id, history.goal.scenario, knobs, None, None, stage="baseline", n=n)


def pending_confirm(history: History) -> CandidateCard | None:
    """The confirm of the first promising screen not yet confirmed (a confirm a person rejected is skipped)."""
    done = history.finished_keys
    for o in history.outcomes:
        if o.decision == "promising":
            conf = with_stage(o.card, "confirm", history.goal.protocol.confirm_n)
            if conf.experiment_key not in done and history.vetoed(conf) is None:  # a rejected confirm is skipped
                return conf
    return None


def extension_allowed(history: History) -> bool:
    """`budget_extension: ask` (or auto, which never extends without a person): the confirm of a promising screen
    (or the recovery of a confirmed gain) the budget cannot pay for is proposed anyway, and the loop asks a person
    for the extension instead of stopping."""
    return history.goal.authorisation.get("budget_extension", "ask") != "deny"


def confirm(conf: CandidateCard, history: History, diag: Diagnosis | None) -> Plan | None:
    """The confirm of a promising screen (its parent's reference at the confirm N first); when only the budget
    refuses it and extensions may be asked for, proposed anyway (the loop asks). None: the reference was
    rejected by a person, so the confirm cannot be compared (the planner moves on)."""
    ext = extension_allowed(history)
    if history.reference(conf.parent_knobs, conf.n) is None:
        base = reference_card(history, conf.parent_knobs, conf.n)
        if history.vetoed(base) is not None:
            return None
        return checked(base, history, diag, f"reference of the parent at N={conf.n} before confirming",
                       extension_ok=ext)
    return checked(conf, history, diag, "confirm a promising screen", extension_ok=ext)


def checked(card: CandidateCard, history: History, diag: Diagnosis | None, why: str,
            extension_ok: bool = False) -> Plan:
    """The plan that runs this protocol card, or the stop that names what refused it."""
    refusals = check(card, history)
    if refusals and extension_ok and budget_only(refusals):
        card = card.model_copy(update={"est_card_hours": round(estimate(card, history), CARD_HOURS_DIGITS)})
        return Plan(card=card, diagnosis=diag, ranked=[PlanRow.of(card.title(), 1.0, f"{why}; needs a budget extension: "
                                                        + said(refusals))])
    if refusals:
        spent = "budget spent: " if budget_only(refusals) else ""
        return Plan(card=None, diagnosis=diag, ranked=[PlanRow.of(card.title(), 0.0, "", refusals)],
                    stop_reason=f"{spent}cannot run the {why}: " + said(refusals))
    card = card.model_copy(update={"est_card_hours": round(estimate(card, history), CARD_HOURS_DIGITS)})
    return Plan(card=card, diagnosis=diag, ranked=[PlanRow.of(card.title(), 1.0, why)])
