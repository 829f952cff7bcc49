"""vLLM's `vllm:iteration_tokens_total` histogram (tokens per engine step) as a simulated instance keeps it.

vLLM observes, once per engine step, the step's prompt tokens plus its generated tokens (a speculative step's
accepted drafts + 1 per request); the buckets are its own (cudagraph capture sizes up to the largest budget).
"""
from __future__ import annotations

import bisect
from functools import lru_cache
from itertools import accumulate

BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NAME = "vllm:iteration_tokens_total"


class IterationTokens:
    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.buckets = [0] * len(BUCKETS)  # per bucket, not cumulative

    def observe(self, tokens: float) -> None:
        self.count += 1
        self.sum += tokens
        i = bisect.bisect_left(BUCKETS, tokens)
        if i < len(BUCKETS):
            self.buckets[i] += 1

    def series(self, labels: str = "") -> dict[str, float]:
        """Prometheus series (`_count`, `_sum`, cumulative `_bucket{le=...}`); `labels`: 'engine="0"' and so on."""
        count, total, buckets = _names(labels)
        out = {count: float(self.count), total: float(self.sum)}
        out.update(zip(buckets, map(float, accumulate(self.buckets))))
        out[buckets[-1]] = float(self.count)
        return out


@lru_cache(maxsize=None)
def _names(labels: str) -> tuple[str, str, tuple[str, ...]]:
    """The series' names for one label set (built once: a run scrapes every instance every simulated second)."""
    sep = f"{labels}," if labels else ""
    tail = f"{{{labels}}}" if labels else ""
    return (f"{NAME}_count{tail}", f"{NAME}_sum{tail}",
            tuple(f'{NAME}_bucket{{{sep}le="{le}"}}' for le in [*map(float, BUCKETS), "+Inf"]))
