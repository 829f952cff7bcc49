"""Result models shared by the metrics code, the verdicts, the executor and the planner.

Units: latencies in milliseconds, windows in seconds, throughput in output tokens per second.
A figure that could not be measured is None, never 0 (a native window that was too short has no
native figure at all).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

VerdictKind = Literal["valid", "orchestration_fault", "collection_fault", "contract_violation"]


class Dist(BaseModel):
    model_config = ConfigDict(frozen=True)
    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class WindowFigures(BaseModel):
    """Figures over one time window [start, end] of a run."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["whole", "native"]
    start: float
    end: float
    duration: float
    n_requests: int  # requests started (t_send) inside the window
    output_tokens: float  # tokens whose timestamps fall in the window
    output_tok_s: float
    output_tok_s_per_card: float
    qps: float  # completions per second inside the window
    achieved_concurrency: float  # time-average in-flight requests
    goodput: float | None = None  # requests meeting every SLO per second, when SLOs were given


class Summary(BaseModel):
    model_config = ConfigDict(frozen=True)
    n_total: int  # records in the raw file, warm-up included
    n_formal: int  # non-warm-up requests
    n_sent: int
    n_ok: int
    n_failed: int
    cards: int
    concurrency: int
    request_rate: float
    whole: WindowFigures | None
    native: WindowFigures | None
    native_reason: str | None = None  # why there is no native figure
    ttft_ms: Dist
    tpot_ms: Dist
    itl_ms: Dist
    e2e_ms: Dist
    queue_delay_ms: Dist
    cache_hit: float | None = None  # sum cached / sum input over formal requests
    cache_hit_min_request: float | None = None
    prompt_uncached_mean: float | None = None  # mean n_in - n_cached (0 when not reported) over formal requests
    output_len_min: int | None = None
    output_len_max: int | None = None
    definitions: dict[str, str] = Field(default_factory=dict)


class Contract(BaseModel):
    """The scenario contract a valid run must keep."""

    model_config = ConfigDict(frozen=True)
    output_len: int | None  # None: each request's own (n_out_expected), as a scenario of the user's traffic has it
    all_succeed: bool = True
    zero_cache: bool = False
    min_request_hit: float | None = None
    cards_required: int | None = None
    min_formal_sent: int = 1


class Reason(BaseModel):
    model_config = ConfigDict(frozen=True)
    code: str  # e.g. failed_requests, short_output, unexpected_cache_hit, cache_hit_below, cards_missing
    message: str
    count: int = 0
    request_ids: list[int] = Field(default_factory=list)


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: VerdictKind
    reasons: list[Reason] = Field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.kind == "valid"
