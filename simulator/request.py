"""One request's state inside the simulated cluster (internal to the simulator)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SimRequest:
    __slots__ = ("id", "n_in", "n_out", "hashes", "t_submit", "formal", "no_cache", "finish_reason",
                 "n_cached", "looked_up", "remaining", "ctx", "p_inst", "rank", "t_prefill_end",
                 "t_ready", "d_inst", "s0", "s_end", "t_admit", "tokens", "t_finish", "emitted", "accepted")

    def __init__(self, req_id: int, n_in: int, n_out: int, hashes: list[int], t: float,
                 formal: bool = True, no_cache: bool = False, finish_reason: str = "length"):
        self.id = req_id
        self.n_in = n_in
        self.n_out = n_out  # tokens this request will actually produce
        self.hashes = hashes
        self.t_submit = t
        self.formal = formal
        self.no_cache = no_cache
        self.finish_reason = finish_reason
        self.n_cached = 0
        self.looked_up = False
        self.remaining = n_in  # prompt tokens still to compute
        self.ctx = 0  # KV present for this request on its prefill rank
        self.p_inst = -1
        self.rank = -1
        self.t_prefill_end: float | None = None
        self.t_ready: float | None = None  # KV arrived at the decode instance
        self.d_inst = -1
        self.s0 = -1  # decode step count when admitted: resident for steps s0+1 .. s_end
        self.s_end = -1
        self.t_admit: float | None = None  # first token leaves the decode instance
        self.tokens: np.ndarray | None = None  # tokens emitted per decode step
        self.t_finish: float | None = None
        self.emitted = 0  # online streaming cursor: decode steps already reported
        self.accepted: list[int] | None = None  # decode steps that accepted each draft position


class Event(NamedTuple):
    """kind: first (n_tokens=1, n_cached) | chunk (n_tokens) | finish (n_out, finish_reason)."""

    kind: str
    req_id: int
    t: float
    n_tokens: int = 0
    n_cached: int | None = None
    n_out: int | None = None
    finish_reason: str | None = None
