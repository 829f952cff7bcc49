"""Device time charged for one trial, as CostEntries (seconds × cards in use).

Two cost models, one shape: a real target charges what it measured (the deploy phase's seconds, the load's
wall seconds); the simulator charges its profile's fixed costs for a restart (restart + weight load +
warm-up, relayout when the layout changed) and the load's virtual seconds. Each transport picks its model.
"""
from __future__ import annotations

from typing import Any, Protocol

from core.trial import CostEntry


class FixedCosts(Protocol):
    """Device seconds a profile states for each kind of change (core.profiles.Costs has these fields)."""

    restart_s: float
    weight_load_s: float
    warmup_s: float
    relayout_s: float


def charges(deploy: dict[str, Any], load_s: float, cards: int, profile_s: float | None,
            fixed: FixedCosts | None = None) -> list[CostEntry]:
    """What a run cost: a restart (and its relayout) when deploy restarted, the load, a profile window."""
    out: list[CostEntry] = []
    measured = sum(st.get("seconds", 0.0) for st in deploy.get("relayout_steps", []) if isinstance(st, dict))
    if deploy.get("restarted"):
        restart_s = fixed.restart_s if fixed else max(0.0, deploy.get("seconds", 0.0) - measured)
        out.append(CostEntry(what="restart", seconds=restart_s, cards=cards))
        if fixed:
            out.append(CostEntry(what="weight_load", seconds=fixed.weight_load_s, cards=cards))
            out.append(CostEntry(what="warmup", seconds=fixed.warmup_s, cards=cards))
        if deploy.get("cost_class") == "relayout":
            out.append(CostEntry(what="relayout", seconds=fixed.relayout_s if fixed else measured, cards=cards))
    out.append(CostEntry(what="load", seconds=load_s, cards=cards))
    if profile_s is not None:
        out.append(CostEntry(what="profile", seconds=profile_s, cards=cards))
    return out
