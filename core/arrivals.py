"""The benchmark client's arrival process: when each request is meant to be sent (t_sched)."""
from __future__ import annotations

import math

import numpy as np
from core.errors import FieldError

ARRIVALS = ("constant", "poisson", "gamma")


def schedule(n: int, rate: float, arrival: str = "constant", burstiness: float = 1.0,
             seed: int = 0, start: float = 0.0) -> list[float]:
    """Send times of n requests at rate r (req/s); inf sends all at `start` (C alone limits)."""
    if arrival not in ARRIVALS:
        raise FieldError("arrival", f"must be one of {list(ARRIVALS)}, got {arrival!r}")
    if not rate > 0:
        raise FieldError("request_rate", f"must be > 0 or inf, got {rate}")
    if burstiness <= 0:
        raise FieldError("burstiness", f"must be > 0, got {burstiness}")
    if math.isinf(rate) or n == 0:
        return [start] * n
    if arrival == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        rng = np.random.default_rng([seed, 17])
        shape = 1.0 if arrival == "poisson" else burstiness  # vllm bench serve: gamma(burstiness, 1/(r·b))
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    gaps[0] = 0.0
    return (start + np.cumsum(gaps)).tolist()
