"""Card-hour estimates learnt from the executor's CostEntry records (the planner's cost model, part of the History):
conservative defaults before the first run, then what was measured."""
from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SECONDS = {"restart": 300.0, "weight_load": 600.0, "warmup": 60.0, "relayout": 1800.0,
                   "profile": 300.0}  # s per step: conservative (a judgement) until the executor reports what it took
RESTARTING = ("restart", "relayout", "topology", "rebuild")
DEFAULT_CARDS = 16  # cards charged until a cost entry or the goal says (agent/loop/record.py's fallback too)
LOAD_S_PER_REQUEST = 0.5  # seconds of load per request before a load was measured (a judgement, conservative)


class CostModel(BaseModel):
    """Card-hour estimates learnt from the executor's CostEntry records."""

    model_config = ConfigDict(frozen=True)
    cards: int = DEFAULT_CARDS
    seconds: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_SECONDS))
    load_s_per_request: float = LOAD_S_PER_REQUEST

    @classmethod
    def learn(cls, cards: int, runs: Iterable[tuple[int, list[Any]]]) -> "CostModel":
        """runs: (N, list of CostEntry-like objects with .what/.seconds/.cards) per finished run."""
        sums: dict[str, list[float]] = {}
        per_req: list[float] = []
        seen_cards = cards
        for n, costs in runs:
            for c in costs:
                what, secs = getattr(c, "what", None), float(getattr(c, "seconds", 0.0))
                seen_cards = max(seen_cards, int(getattr(c, "cards", 0) or 0))
                if what == "load" and n > 0:
                    per_req.append(secs / n)
                elif what:
                    sums.setdefault(what, []).append(secs)
        secs = dict(DEFAULT_SECONDS) | {k: sum(v) / len(v) for k, v in sums.items() if v}
        lpr = max(per_req) if per_req else LOAD_S_PER_REQUEST  # the slowest observed: never under-estimate
        return cls(cards=seen_cards, seconds=secs, load_s_per_request=lpr)

    def estimate(self, cost_class: str, n: int, warmup: int = 0, needs_restart: bool | None = None) -> float:
        """Card-hours for one run: (restart + weight load if needed) + warm-up + load (+ relayout)."""
        restart = cost_class in RESTARTING if needs_restart is None else needs_restart
        s = self.load_s_per_request * (n + warmup)
        if warmup:
            s += self.seconds.get("warmup", 0.0)
        if restart:
            s += self.seconds.get("restart", 0.0) + self.seconds.get("weight_load", 0.0)
        if cost_class == "relayout":
            s += self.seconds.get("relayout", 0.0)
        return s * self.cards / 3600.0
