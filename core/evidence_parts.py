"""The typed parts of a run's evidence (core/evidence.py): the latency breakdown by role, the MoE expert load per
role, a profile capture's summary and the calibrated simulator's drift record. Readers read attributes; each part
dumps exactly the dict its producer wrote (a field the record did not hold is not added, keys a newer producer
adds are kept), so a stored run reads and writes back unchanged.

The breakdown's stages differ by source (the simulator's instance-seconds, a profile's, older captures that state
the imbalance as a share, nested): it keeps the record as written and reads its stages as numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, RootModel, SerializerFunctionWrapHandler, Tag,
                      TypeAdapter, model_serializer)

from core.summary import Summary

NOT_ACCOUNTED = ("elapsed_s", "idle_s")  # seconds a role's breakdown states that are not device time spent


def number(v: Any) -> float | None:
    """A figure as a float, or None where it is missing or not a number (NaN, a boolean, text, a dict)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


class Part(BaseModel):
    """A part of the evidence as its producer wrote it: dumps only the fields the record held (and any extra)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        held = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in handler(self).items() if k in held}


@dataclass(frozen=True)
class Stages:
    """One role's breakdown, read: its stages' seconds (None where the record has no number for one)."""

    raw: Mapping[str, Any]

    def seconds(self, stage: str) -> float | None:
        """A stage's figure (e.g. imbalance_s, draft_s) as a number, or None."""
        return number(self.raw.get(stage))

    @property
    def busy_share(self) -> float | None:
        return self.seconds("busy_share")

    @property
    def scheduling_s(self) -> float | None:
        return self.seconds("scheduling_s")

    @property
    def accounted_s(self) -> float:
        """The device time the role's stages account for: every `*_s` figure but elapsed and idle."""
        return sum(f for k, v in self.raw.items() if k.endswith("_s") and k not in NOT_ACCOUNTED
                   and (f := number(v)) is not None)


class Breakdown(RootModel[dict[str, Any]]):
    """The latency breakdown by role ({role: {stage: seconds}}), as the simulator or a profile wrote it."""

    model_config = ConfigDict(frozen=True)
    root: dict[str, Any] = Field(default_factory=dict)

    def role(self, role: str) -> Stages | None:
        """One role's stages (prefill, decode, mixed), or None where the record has none for it."""
        got = self.root.get(role)
        return Stages(got) if isinstance(got, dict) else None

    def roles(self) -> dict[str, Stages]:
        """Every role the breakdown states as stages."""
        return {str(r): Stages(d) for r, d in self.root.items() if isinstance(d, dict)}

    def __bool__(self) -> bool:
        return bool(self.root)


class ExpertLoad(Part):
    """One role's MoE expert load (core/evidence_decode.py): each EP rank's share of the routed tokens, summed
    over the role's instances, and the worst instance's most loaded rank over the mean."""

    per_rank: list[float]
    max_over_mean: float
    worst_instance: str | None = None
    per_instance: dict[str, float] | None = None


class InstanceFigures(Part):
    """One engine instance's own figures over its own scrapes (executor/evidence_instances.py); None where it exported
    nothing. Counters (requests, KV hand-off) are deltas over the load; `batch_fill` is the batch against its limit
    (decode; a prefill instance runs one-token requests)."""

    role: str
    scrapes: int
    requests: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    batch_fill: float | None = None
    kv_usage_max: float | None = None
    kv_tokens_remote: float | None = None
    kv_transfers: float | None = None
    kv_bytes: float | None = None
    kv_failed: float | None = None

    def figure(self, name: str) -> float | None:
        """One figure by name (the spread's figures, executor/evidence_instances.py SPREAD)."""
        return getattr(self, name)


class Spread(Part):
    """How unevenly a role's instances carry one figure: the most loaded over the mean, and the instances at both
    ends (`max` carries the most, `min` the least)."""

    max_over_mean: float
    max: str
    min: str


class RankFigures(Part):
    """One DP / EP rank's own figures over the load (executor/evidence_ranks.py); None where the rank exported
    nothing for one. `step_s`: the mean time between its tokens (its step time, where the engine exports it)."""

    running_mean: float | None = None
    waiting_mean: float | None = None
    kv_usage_max: float | None = None
    step_s: float | None = None


class RankSpread(Part):
    """One figure combined over an instance's ranks: the sum, the maximum and the median over the ranks reporting
    it, and the rank at the maximum (`worst`: for the step time the slowest, which gates every step)."""

    sum: float
    max: float
    median: float
    worst: str
    ranks: int


class RankGroup(Part):
    """An instance of two or more ranks: each rank's figures and each figure combined over them."""

    role: str
    ranks: dict[str, RankFigures]
    combined: dict[str, RankSpread]


class Kernel(Part):
    name: str
    seconds: float


class ProfileSummary(Part):
    """A profile capture's summary (executor/profilers.py): device seconds by kind, their shares, the top kernels;
    or, where the capture found no trace, `files` 0 and the error."""

    files: int = 0
    devices: int | None = None
    window_s: float | None = None
    seconds: dict[str, float] | None = None
    share: dict[str, float] | None = None
    top_kernels: list[Kernel] | None = None
    method: str | None = None
    error: str | None = None


def _profile_kind(v: Any) -> str:
    if isinstance(v, (ProfileSummary, Breakdown)):
        return "capture" if isinstance(v, ProfileSummary) else "breakdown"
    return "capture" if isinstance(v, dict) and "files" in v else "breakdown"


# a profile's summary: a trace capture's (executor/profilers.py), or the simulator's breakdown by role
# (executor/transports/sim.py: its profile is the run's breakdown)
Profile = Annotated[Annotated[ProfileSummary, Tag("capture")] | Annotated[Breakdown, Tag("breakdown")],
                    Discriminator(_profile_kind)]

PROFILE: TypeAdapter[ProfileSummary | Breakdown] = TypeAdapter(Profile)


def profile_of(summary: dict[str, Any] | None) -> ProfileSummary | Breakdown | None:
    """A profile step's summary, typed (None where the capture brought none back)."""
    return None if summary is None else PROFILE.validate_python(summary)


class DriftFigures(Part):
    """The figures the drift check compares (executor/drift.py FIGURES)."""

    output_tok_s: float | None = None
    tpot_mean_ms: float | None = None


class Drift(Part):
    """The calibrated simulator's prediction of a real run against its measurement (executor/drift.py): predicted,
    measured, their relative drift, the worst, and whether it passed the target's threshold; or the error of a
    profile that cannot predict the station. `summary` is the whole predicted Summary."""

    profile: str
    threshold: float
    error: str | None = None
    predicted: DriftFigures | None = None
    measured: DriftFigures | None = None
    drift: DriftFigures | None = None
    worst: float | None = None
    flagged: bool = False
    knobs_not_modelled: list[str] | None = None
    suggestion: str | None = None
    # the calibrated simulator's whole Summary of the station (the run's SLOs, so goodput): a reader shows any figure
    # the goal names (its objective, each limit at its statistic) predicted beside measured, not only the two above
    summary: Summary | None = None
