"""One base for everything that proposes a card (as optuna's samplers share `BaseSampler`): the planner asks every
registered proposer (agent/planner/proposers/__init__.py) and treats what comes back the same way.

A proposer declares when it is asked (`phase`):
* `recover`: a card that keeps a gain already confirmed (a lost native window, a load gain that broke only a
  decode-side latency limit). Asked first, in registry order; the first card a person has not rejected runs, through the same
  checks as every card (a budget the card cannot pay is asked of a person, not spent).
* `rank`: valued moves from the best station (`Value`: the gain the evidence expects, its confidence and its cost
  in card-hours). Every rank proposer's moves are pooled, ranked by the same value per card-hour and passed
  through the same checks; a proposer may also hold back other proposers' one-change moves its evidence says
  are held back alone (`holds`), valued at a share of what they were. One that could lead but does not says why
  on the cards (`yields`).
* `explore`: asked only when no ranked move passes worth its cost (or too many in a row changed nothing); its
  moves carry the model's prediction (`Forecast`), and the stop rules read them (agent/planner/stops.py).

What a proposer answers (`Proposals`) has hooks, no-ops by default as optuna's sampler hooks are: a proposer that
leads the ranking (the twin) answers with a subclass whose `lead` says why, whose `judge` values every pooled move
by its model, whose `likely` names the moves worth running whatever the rules' least value, and whose `settled`
says why nothing is left to gain. A new proposer is one module here and one line in the registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal, Protocol

from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from agent.planner.value import Value

Phase = Literal["recover", "rank", "explore"]
PHASES: tuple[Phase, ...] = ("recover", "rank", "explore")
RULES_LED = "led by the evidence rules"  # said on the cards when a proposer that could lead yields


class Forecast(Protocol):
    """An explore-phase move's prediction, as the stop rules read it: the expected improvement over the best
    station (percent of its objective) and the prediction in words."""

    @property
    def ei_pct(self) -> float: ...

    def text(self, metric: str) -> str: ...


@dataclass(frozen=True)
class Asking:
    """What every proposer is asked with."""

    history: History
    diag: Diagnosis | None
    restart: float = 0.0  # card-hours of a restart at the screen N (the value model's cost scale)
    native_missing: bool = False  # the objective is read in the native window and the best run has none


@dataclass(frozen=True)
class Exploring:
    """What the explore phase tells its proposers besides the asking (`Proposer.explore`): why the ranked moves
    were not enough (said on the cards), and how a screen card is re-staged where a screen cannot serve (straight
    to the confirm N)."""

    why_rules: str
    restage: Callable[[CandidateCard], CandidateCard] | None = None


@dataclass(frozen=True)
class Proposed:
    card: CandidateCard
    value: Value | None = None  # None for a recovery (it runs first, unranked)
    prediction: Forecast | None = None  # an explore-phase move's prediction (the stop rules read it)
    why: str = ""  # a recovery's reason, in the plan's words


@dataclass
class Proposals:
    """One proposer's answer to one asking, with the hooks of a proposer that leads (no-ops here)."""

    moves: list[Proposed] = field(default_factory=list)
    # (knob, repr(value)) of a one-change move -> why this proposer's evidence holds it back alone
    holds: dict[tuple[str, str], str] = field(default_factory=dict)
    told: int = 0  # valid runs a model was told (an explore-phase proposer's basis, named in a stop reason)
    yields: str = ""  # why a proposer that could lead does not (said on the cards of those that lead instead)

    def lead(self) -> str:
        """Why this proposer leads the ranking (said on every card it values; its moves rank first); "": it does not."""
        return ""

    def judge(self, card: CandidateCard) -> tuple[CandidateCard, Value] | None:
        """A leading proposer's value of any pooled move ((card with its prediction, value)); None: it cannot say,
        the move keeps its own value."""
        return None

    def likely(self, card: CandidateCard, value: Value) -> bool:
        """A move the leading proposer calls worth running whatever the rules' least value (value.MIN_VALUE)."""
        return False

    def settled(self) -> str:
        """Why a leading proposer that searched the space finds nothing worth the least gain (the planner stops on
        it instead of exploring, once no move is worth running); "" otherwise."""
        return ""


class Proposer:
    """The base of every proposer: its name (the record's), its phase and `propose`."""

    name: ClassVar[str]
    phase: ClassVar[Phase]

    def propose(self, asking: Asking) -> Proposals:
        raise NotImplementedError

    def explore(self, asking: Asking, exploring: Exploring) -> Proposals:
        """The explore phase's ask (a hook, as `Proposals`' are): a proposer that reads the explore context
        overrides it; by default it is `propose`."""
        return self.propose(asking)
