"""vLLM's `vllm:iteration_tokens_total` histogram (tokens per engine step) as a simulated instance keeps it.

vLLM observes, once per engine step, the step's prompt tokens plus its generated tokens (a speculative step's
accepted drafts + 1 per request); the buckets are its own (cudagraph capture sizes up to the largest budget).
"""
from __future__ import annotations

import bisect

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
        sep = f"{labels}," if labels else ""
        out = {f"{NAME}_count" + (f"{{{labels}}}" if labels else ""): float(self.count),
               f"{NAME}_sum" + (f"{{{labels}}}" if labels else ""): float(self.sum)}
        cum = 0
        for le, n in zip(BUCKETS, self.buckets):
            cum += n
            out[f'{NAME}_bucket{{{sep}le="{float(le)}"}}'] = float(cum)
        out[f'{NAME}_bucket{{{sep}le="+Inf"}}'] = float(self.count)
        return out
