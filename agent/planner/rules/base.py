"""What every rule is made of: a scorer over the evidence digest, its moves, its value model, its prompt line.

A rule never reads an engine's name: only the digest keys (executor.evidence.digest) and the run's Summary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from core.summary import Summary

SUPPORTED, OPEN_LOW = 0.6, 0.3  # likelihood bands: supported >= 0.6 > open >= 0.3 > weak


class Hypothesis(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    likelihood: float = Field(ge=0.0, le=1.0)
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)

    @property
    def status(self) -> str:
        if self.likelihood >= SUPPORTED:
            return "supported"
        return "open" if self.likelihood >= OPEN_LOW else "weak"


class MoveRule(BaseModel):
    """What changing one knob in one direction tests, and how much it might gain if the hypothesis holds."""

    model_config = ConfigDict(frozen=True)
    hypotheses: tuple[str, ...] = ()
    gain: float = 0.05  # likely relative gain on the objective if the hypothesis holds
    mechanism: str = "changes the knob's resource allocation"
    decision: str = "whether this knob limits the objective here"
    expected: str = "a small change in output tok/s per card"
    rules_out: str = "this knob as a lever at the parent station"
    tradeoff: bool = False  # may lose on the objective but win on latency (kept on the frontier)


@dataclass(frozen=True)
class Ctx:
    """What a scorer reads: the best station's latest Summary and digest, the TPOT limit, the deployed knobs, the
    hypotheses a negative from this station already tested, and the latency headroom (once latency is scored)."""

    summary: Summary | None
    ev: dict[str, Any]
    tpot_limit_ms: float | None
    knobs: dict[str, Any]
    ruled_out: frozenset[str] = frozenset()
    headroom: float | None = None


@dataclass(frozen=True)
class Adjusted:
    """A value model's answer for one move: confidence and gain after the evidence, and why."""

    confidence: float
    gain: float
    note: str = ""
    answered: bool = False  # the evidence already answers what the screen would ask: it rules out nothing new


ValueModel = Callable[[Any, bool, Any, float, float], Adjusted | None]  # (change, up, diagnosis, conf, gain)
# a jump the rule's evidence sizes for one knob, beyond the next listed value: (knob, current value, listed
# values, history, diagnosis) -> (direction, value, expected effect in words), or None
SizedMove = Callable[[str, Any, list, Any, Any], "tuple[str, Any, str] | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    prompt: str  # its line of the LLM system prompt
    score: Callable[[Ctx], Hypothesis]
    moves: dict[tuple[str, str], MoveRule] = field(default_factory=dict)
    value: ValueModel | None = None
    sized: SizedMove | None = None  # where the evidence sizes a move's step (a jump), not only its direction
    # a throughput explanation a profile capture can tell apart from the others (latency and load are about
    # the offered load; KV capacity is read directly off the KV usage)
    separable: bool = True


def num(ev: dict[str, Any], key: str) -> float | None:
    v = ev.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def decode_at_limit(ev: dict[str, Any]) -> bool:
    """Decode running peaked at (>= 95 % of) its per-instance batch limit."""
    run_max, limit = num(ev, "decode_running_max"), num(ev, "decode_batch_limit")
    return run_max is not None and limit is not None and limit > 0 and run_max >= 0.95 * limit


def decode_full(ev: dict[str, Any]) -> str | None:
    """Why decode cannot take more requests (batch limit reached, KV cache full), or None."""
    run_max, limit, kv = num(ev, "decode_running_max"), num(ev, "decode_batch_limit"), num(ev, "kv_usage_max")
    if decode_at_limit(ev) and num(ev, "decode_busy_slots_mean") is None:
        return f"running {run_max:.0f} of a {limit:.0f} batch limit"
    waiting = num(ev, "decode_waiting_mean")
    if kv is not None and kv >= 0.98 and (waiting is None or waiting > 0.5):  # a peak nobody waits behind is not full
        return f"KV cache usage {kv:.0%}"
    return None


def role_terms(ev: dict[str, Any], term: str) -> dict[str, float]:
    """Share of each role's accounted device time spent in one breakdown term (e.g. imbalance_s, draft_s)."""
    out: dict[str, float] = {}
    for role, d in (ev.get("breakdown") or {}).items():
        if not isinstance(d, dict) or not isinstance(d.get(term), (int, float)):
            continue
        total = sum(float(v) for k, v in d.items() if k.endswith("_s") and k not in ("elapsed_s", "idle_s")
                    and isinstance(v, (int, float)))
        if total > 0:
            out[str(role)] = float(d[term]) / total
    return out
