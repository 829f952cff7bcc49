"""One interface for everything that proposes a card (as optuna's samplers share one): the planner asks every
registered proposer (agent/planner/proposers/__init__.py) and treats what comes back the same way.

A proposer declares when it is asked (`phase`):
* `recover`: a card that keeps a gain already confirmed (a lost native window, a load gain that broke only a
  decode-side latency limit). Asked first, in registry order; the first card a person has not rejected runs, through the same
  checks as every card (a budget the card cannot pay is asked of a person, not spent).
* `rank`: valued moves from the best station (`Value`: the gain the evidence expects, its confidence and its cost
  in card-hours). Every rank proposer's moves are pooled, ranked by the same value per card-hour and passed
  through the same checks; a proposer may also hold back other proposers' one-change moves its evidence says
  are held back alone (`holds`), valued at a share of what they were.
  A proposer that leads (`lead`, the twin) values every pooled move with its `judge` instead, and its own
  moves rank first; one that yields says why on the cards (`yields`).
* `explore`: asked only when no ranked move passes worth its cost (or too many in a row changed nothing); its
  moves carry the model's prediction, and the stop rules read them (agent/planner/stops.py).
A new proposer is one module here and one line in the registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from agent.planner.value import Value

Phase = Literal["recover", "rank", "explore"]


@dataclass(frozen=True)
class Asking:
    """What every proposer is asked with."""

    history: History
    diag: Diagnosis | None
    restart: float = 0.0  # card-hours of a restart at the screen N (the value model's cost scale)
    native_missing: bool = False  # the objective is read in the native window and the best run has none
    # explore phase: why the rules' moves were not enough, and how a screen card is re-staged where a screen
    # cannot serve (straight to the confirm N)
    why_rules: str = ""
    restage: Callable[[CandidateCard], CandidateCard] | None = None


@dataclass(frozen=True)
class Proposed:
    card: CandidateCard
    value: Value | None = None  # None for a recovery (it runs first, unranked)
    prediction: Any = None  # the explorer's model prediction
    why: str = ""  # a recovery's reason, in the plan's words


@dataclass
class Proposals:
    moves: list[Proposed] = field(default_factory=list)
    # (knob, repr(value)) of a one-change move -> why this proposer's evidence holds it back alone
    holds: dict[tuple[str, str], str] = field(default_factory=dict)
    told: int = 0  # valid runs a model was told (the explorer's basis, named in a stop reason)
    # a proposer that leads (the twin, while it predicts this goal's runs inside its interval): why, on every card
    # it values; `judge` values any pooled move by its model ((card with its prediction, value), or None: it
    # cannot say, the move keeps its own value) and its moves rank before the others'
    lead: str = ""
    judge: Callable[[CandidateCard], tuple[CandidateCard, Value] | None] | None = None
    yields: str = ""  # why a proposer that could lead does not (said on the cards of those that lead instead)
    # a leading model that has searched the space and finds nothing worth the least gain: why (the planner stops on
    # it instead of exploring, once no move is worth running)
    settled: str = ""


class Proposer(Protocol):
    name: str
    phase: Phase

    def propose(self, asking: Asking) -> Proposals: ...
