"""Why a card may not run: a refusal is a kind (the check that refused it) and its words.

The kind is what code branches on (a budget that alone refuses a card, a person's veto, a card that is no
candidate at all); the words are what people read. `str()` of a refusal is the line the record has always
carried, "<kind>: <words>", so nothing a person reads changed when refusals stopped being parsed back.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable


class RefusalKind(str, Enum):
    """The check that refused a card; its value is the code the refusal's line starts with."""

    GOAL = "goal"  # the card is for another goal or scenario
    ONE_CHANGE = "one_change"  # not exactly the change(s) it names
    KNOB_EXISTS = "knob_exists"  # the knob is unknown, or not the engine's
    DEPENDENCIES = "dependencies"  # a knob that needs another set first
    IN_RANGE = "in_range"  # a value outside the knob's range or the goal's space
    PREDICTED_NEGATIVE = "predicted_negative"  # the calibrated simulator set it aside unrun
    PARENT = "parent"  # a screen not from the best station
    QUALITY_RISK = "quality_risk"  # the card's quality-risk flag is wrong
    COST_CLASS = "cost_class"  # the card's cost class is wrong
    PROTOCOL = "protocol"  # the N does not match the stage
    REJECTED = "rejected"  # a person (or the authorisation table) vetoed it under the same conditions
    MEASURED = "measured"  # this station was measured at this N already
    NOT_FINISHED = "not_finished"  # the experiment ran already
    FAULTS = "faults"  # the experiment faulted too often
    AFFORDABLE = "affordable"  # the budget cannot pay for it
    KNOWN_NEGATIVE = "known_negative"  # negative under the same conditions
    CARDS = "cards"  # it would run on fewer cards than the goal requires
    INERT = "inert"  # the evidence shows its change cannot move the objective
    QUALITY_FAILED = "quality_failed"  # it makes the quality-risk settings of a failed accuracy evaluation


# not candidates at all: measured, ran, a known negative, a change the evidence shows cannot move the objective, a
# station that could never be deployed (its quality-risk settings failed an accuracy evaluation)
GONE = frozenset({RefusalKind.NOT_FINISHED, RefusalKind.KNOWN_NEGATIVE, RefusalKind.MEASURED, RefusalKind.INERT,
                  RefusalKind.QUALITY_FAILED})


@dataclass(frozen=True)
class Refusal:
    """One check's refusal of a card."""

    kind: RefusalKind
    words: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.words}"


def said(refusals: Iterable[Refusal]) -> str:
    """The refusals as the record shows them: their lines, joined by '; '."""
    return "; ".join(str(r) for r in refusals)


def budget_only(refusals: Iterable[Refusal]) -> bool:
    """Only the budget refuses (true of no refusals too, as `all` is): an extension would let it run."""
    return all(r.kind is RefusalKind.AFFORDABLE for r in refusals)
