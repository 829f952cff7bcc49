"""A proposer that raises never stops a goal: the planner asks every proposer through `asked`.

A proposer is one model of the deployment among several (the twin, the coupled pairs, the evidence rules, the
explorer); a bug in one, or a station its model cannot handle, must not end an unattended night's tuning. A raise is
read as that proposer yielding: it proposes nothing, it does not lead, and its reason (the exception's type and
message) is said on the cards of the proposers that lead instead, so a person reading the card sees it. A leading
proposer's judge that raises on one card leaves that card its own value (as for a move the judge cannot predict).
"""
from __future__ import annotations

from agent.planner.candidates import CandidateCard
from agent.planner.proposers.base import Asking, Exploring, Proposals, Proposer
from agent.planner.value import Value

REASON_CHARS = 300  # a raised message is kept to this many characters on a card (a traceback is not a reason)


def failure(name: str, e: Exception) -> str:
    """The words a card carries for a proposer that raised."""
    msg = " ".join(str(e).split())[:REASON_CHARS]
    return f"the {name} proposer failed ({type(e).__name__}: {msg}), so it proposes nothing this time"


def asked(proposer: Proposer, asking: Asking, exploring: Exploring | None = None) -> Proposals:
    """The proposer's proposals (its explore-phase ones where `exploring` is given), or, where it raises, none: it
    yields with the reason."""
    try:
        return proposer.propose(asking) if exploring is None else proposer.explore(asking, exploring)
    except Exception as e:  # noqa: BLE001 - any raise: the goal goes on with the other proposers
        return Proposals(yields=failure(proposer.name, e))


def judged(got: Proposals, card: CandidateCard) -> tuple[CandidateCard, Value] | None:
    """A leading proposer's value of a card; None where its judge cannot value the card or raises on it (the card
    keeps its own value)."""
    try:
        return got.judge(card)
    except Exception:  # noqa: BLE001 - one card the leading model cannot value
        return None
