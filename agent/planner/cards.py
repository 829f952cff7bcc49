"""The card as data (docs/glossary.md): parent station + exactly one change + why, what, and what a negative rules
out; a second change (`also`) only with the coupling the evidence names (`coupling`; agent/planner/pairs.py), and
more changes (`more`) only as the jump to the goal's twin's optimum while the twin predicts this goal's runs inside
its interval (`coupling` names the twin's path; agent/planner/proposers/twin_search.py).

A card is content-hashed twice: `experiment_key` names the experiment (scenario, resulting station,
stage, N: the same key is never run twice) and `content_hash` covers everything a person is shown
(an approval is bound to it). The data model imports no rule: cards are worded from the move table in
agent/planner/candidates.py (build_card), which sits above it.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, computed_field

from core.canonical import canon
from core.canonical import digest as canonical_digest
from core.knobs import catalog
from core.ledger import Prediction

Stage = Literal["screen", "confirm", "baseline"]
DIGEST_LENGTH = 16  # hex digits of a knobs or experiment digest (core.canonical.digest's default): run ids hold it
CONTENT_HASH_LENGTH = 24  # hex digits of a card's content hash, which an approval is bound to (stored ones)
CARD_HOURS_DIGITS = 4  # a card's est_card_hours is stored and shown to 1/10000 of a card-hour


def digest(obj: Any, length: int = DIGEST_LENGTH) -> str:
    """The planner's digest of knobs and cards: the canonical form's hash in its first, spaced layout."""
    return canonical_digest(obj, length, compact=False)


def station_hash(knobs: dict[str, Any]) -> str:
    """The planner's digest of a set of knobs (server + load), its key for "the same knobs" within a goal.
    Not a station hash: that is the executor's hash of the frozen station (engine, every knob with the
    catalog's defaults, data version, source identity), known once a run prepared it, and the one
    `/stations/<hash>` and `tuneloop restore` take (api, agent.loop.record.frozen_stations)."""
    return digest(knobs)


knobs_hash = station_hash  # the name the card fields use


class Change(BaseModel):
    model_config = ConfigDict(frozen=True)
    knob: str
    old: Any = None
    new: Any = None


class CandidateCard(BaseModel):
    model_config = ConfigDict(frozen=True)
    goal_id: str
    scenario: str
    parent_knobs: dict[str, Any]
    change: Change | None = None  # None only for a baseline measurement of the parent itself
    stage: Stage
    n: int
    hypothesis: str | None = None
    mechanism: str
    decision: str
    expected_effect: str
    negative_rules_out: str
    cost_class: str
    quality_risk: bool = False
    planner: str = "deterministic"
    note: str | None = None  # e.g. "retried: parent station changed"
    score: float | None = None  # the planner's rough value estimate
    est_card_hours: float | None = None
    profile_capture: bool = False  # ask the executor for a profile: the queues could not separate the hypotheses
    attempt: int = 1  # > 1: the same experiment again after its earlier attempt(s) ended in a tooling fault
    prediction: Prediction | None = None  # the hypothesis ledger's numeric prediction (core.ledger)
    also: Change | None = None  # a coupled pair's second change (agent/planner/pairs.py), never without `coupling`
    coupling: str | None = None  # which coupling the evidence names, and why one change alone does not do
    more: tuple[Change, ...] = ()  # a twin's jump: its third and later changes, never without `also` and `coupling`
    # why the pre-screen ranked this card first of the passing moves (agent/planner/prescreen.py): this card's own,
    # never carried to its confirm (`with_stage` drops it)
    prescreen: str | None = None

    @property
    def changes(self) -> list[Change]:
        return [c for c in (self.change, self.also, *self.more) if c is not None]

    @property
    def multi(self) -> bool:
        """More than one change: a coupled pair or a twin's jump (tests its coupling, not either change alone)."""
        return len(self.changes) > 1

    @property
    def knobs(self) -> dict[str, Any]:
        return {**self.parent_knobs, **{c.knob: c.new for c in self.changes}}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def parent_knobs_hash(self) -> str:
        """The digest of the parent's knobs (agent.planner.candidates.station_hash), not a frozen station's hash."""
        return knobs_hash(self.parent_knobs)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def knobs_hash(self) -> str:
        """The digest of this card's knobs; its frozen station hash exists once its run prepared it."""
        return knobs_hash(self.knobs)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def experiment_key(self) -> str:  # the digest's field name stays, so run ids stay what they were
        return digest({"scenario": self.scenario, "station": self.knobs_hash, "stage": self.stage, "n": self.n})

    @property
    def station_key(self) -> str:
        """The station in its scenario, whatever the stage and N (what a pre-screen sets aside)."""
        return f"{self.scenario}|{self.knobs_hash}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def content_hash(self) -> str:
        skip = {"parent_knobs_hash", "knobs_hash", "experiment_key", "content_hash", "score", "est_card_hours",
                "prediction"}
        if not self.profile_capture:
            skip.add("profile_capture")  # cards without a profile keep the hashes they always had
        if self.attempt == 1:
            skip.add("attempt")
        if self.also is None and self.coupling is None:
            skip |= {"also", "coupling"}  # one-change cards keep the hashes they always had
        if not self.more:
            skip.add("more")  # as do pairs
        if self.prescreen is None:
            skip.add("prescreen")
        body = self.model_dump(exclude=skip)
        return digest(body, CONTENT_HASH_LENGTH)

    def run_id(self) -> str:
        base = f"{self.goal_id}-{self.stage}-{self.experiment_key}"
        return base if self.attempt == 1 else f"{base}-a{self.attempt}"

    def title(self) -> str:
        if self.change is None:
            return f"{self.stage} N={self.n}: measure the parent station"
        return f"{self.stage} N={self.n}: " + " + ".join(f"{c.knob} {c.old!r} -> {c.new!r}" for c in self.changes)


def change_words(card: dict[str, Any], arrow: str = "->", fmt: Any = repr) -> str | None:
    """A stored card's change(s) in words ("k 1 -> 2", a coupled pair's two joined by " + "); None: a reference."""
    chs = [c for c in (card.get("change"), card.get("also"), *(card.get("more") or ())) if c]
    return " + ".join(f"{c['knob']} {fmt(c['old'])} {arrow} {fmt(c['new'])}" for c in chs) or None


def direction_of(change: Change) -> str:
    """'up' or 'down' for one change, in the knob's own order (None = unlimited sorts above every number;
    enums: any non-default choice is 'up')."""
    return next((d for d, _ in neighbours(change.knob, change.old, [change.new])), "up")


def _order_key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (1, 0)  # None (= unlimited) sorts above every number
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, (int, float)):
        return (0, v)
    return (0, 0)


def neighbours(knob: str, current: Any, values: list[Any]) -> list[tuple[str, Any]]:
    """The next value up and down in the knob's discrete list (enums: every other choice counts as 'up')."""
    k = catalog().get(knob) if knob in catalog() else None
    if k is not None and k.type == "enum":
        default = k.default
        return [("up" if v != default else "down", v) for v in values if v != current]
    if k is not None and k.type == "bool":
        return [("up" if v else "down", v) for v in values if v != current]
    nums = sorted({_order_key(v): v for v in values}.items())
    cur = _order_key(current)
    up = [v for key, v in nums if key > cur]
    down = [v for key, v in nums if key < cur]
    out: list[tuple[str, Any]] = []
    if up:
        out.append(("up", up[0]))
    if down:
        out.append(("down", down[-1]))
    return out


def with_stage(card: CandidateCard, stage: Stage, n: int) -> CandidateCard:
    """The same change re-staged (screen -> confirm at the goal's confirm N)."""
    return card.model_copy(update={"stage": stage, "n": n, "score": None, "prediction": None, "prescreen": None})


def card_record(card: CandidateCard) -> dict[str, Any]:
    """The card as stored (and shown): its fields plus the store's index keys."""
    # an infinite request_rate stays "inf" (JSON mode would write null); a one-change card is stored as it always was
    skip = ({"also", "coupling"} if card.also is None and card.coupling is None else set()) | (set() if card.more else {"more"}) \
        | (set() if card.prescreen else {"prescreen"})
    d = canon(card.model_dump(exclude=skip or None))
    d.update({"knob": card.change.knob if card.change else None,
              "value": card.change.new if card.change else None, "parent_hash": card.parent_knobs_hash})
    return d


def card_of(stored: dict[str, Any]) -> CandidateCard:
    keep = set(CandidateCard.model_fields)
    return CandidateCard.model_validate({k: v for k, v in stored.items() if k in keep})
