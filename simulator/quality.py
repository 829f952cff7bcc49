"""The modelled accuracy evaluation behind the quality gate: quality-risk knobs lower the score."""
from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict

from core.knobs import catalog
from core.profiles import Profile


class QualityResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    score: float
    baseline: float
    passed: bool
    detail: str


def evaluate(profile: Profile, knobs: dict[str, Any], seed: int = 0) -> QualityResult:
    """Accuracy on the profile's eval set: baseline minus each active quality-risk knob's drop, plus noise."""
    q = profile.quality
    eff = profile.knobs(knobs)
    drops: dict[str, float] = {}
    for k in catalog().knobs:
        if k.quality_risk and eff.get(k.name) not in (None, k.default):
            drops[k.name] = getattr(q, f"{k.name}_drop", q.tolerance * 2)
    noise = random.Random(seed * 7919 + 11).gauss(0.0, q.noise)
    score = q.baseline - sum(drops.values()) + noise
    passed = q.baseline - score <= q.tolerance
    detail = ("no quality-risk knob active" if not drops else
              "; ".join(f"{n}: -{d:.3f}" for n, d in drops.items()))
    return QualityResult(score=round(score, 4), baseline=q.baseline, passed=passed,
                         detail=f"{detail}; tolerance {q.tolerance:.3f}")
