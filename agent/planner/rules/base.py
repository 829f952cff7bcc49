"""What every rule is made of: a scorer over the evidence digest, its moves, its value model, its prompt line.

A rule never reads an engine's name: only the digest keys (executor.evidence.digest) and the run's Summary.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict

from core.goalview import Limit
from core.summary import Summary
from agent.planner.diagnosed import OPEN_LOW, SUPPORTED, Diagnosis, Hypothesis  # the bands and what rules make
from core.evidence import Evidence

if TYPE_CHECKING:  # annotations only: the history (agent/planner/tpot_fit.py reads it) is above the rules
    from agent.planner.cards import Change
    from agent.planner.history import History

WEAK = 0.1  # evidence missing or against: weak (under OPEN_LOW), yet not 0, as a later run may still show it
DEFAULT_GAIN = 0.05  # a move no rule owns (candidates.rule_for falls back to MoveRule()): a small prior gain
AT_LIMIT = 0.95  # decode running within 5 % of its batch limit counts as at it: a sampled gauge may miss the peak
KV_FULL = 0.95  # KV usage within 5 % of full: near enough that KV space, not only the batch limit, admits sequences
KV_PEAK_FULL = 0.98  # no new sequence is admitted once the KV blocks run out (~100 %): a 98 % sampled peak is full
WAITING_NEAR_ZERO = 0.5  # a mean decode queue under half a request: it is empty most of the time ("near zero")
QUEUE_PERSISTENT = 0.5  # the prefill queue non-empty in at least half of the samples: persistent, not a passing burst


class MoveRule(BaseModel):
    """What changing one knob in one direction tests, and how much it might gain if the hypothesis holds."""

    model_config = ConfigDict(frozen=True)
    hypotheses: tuple[str, ...] = ()
    gain: float = DEFAULT_GAIN  # likely relative gain on the objective if the hypothesis holds
    mechanism: str = "changes the knob's resource allocation"
    decision: str = "whether this knob limits the objective here"
    expected: str = "a small change in output tok/s per card"
    rules_out: str = "this knob as a lever at the parent station"
    tradeoff: bool = False  # may lose on the objective but win on latency (kept on the frontier)


@dataclass(frozen=True)
class Ctx:
    """What a scorer reads: the best station's latest Summary and digest, the goal's binding latency limit at that
    run (the least slack, core/goalview.py), the deployed knobs, the hypotheses a negative from this station already
    tested, and the headroom under the binding limit (once latency is scored)."""

    summary: Summary | None
    ev: Evidence
    limit: Limit | None
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


ValueModel = Callable[["Change", bool, "Diagnosis", float, float], Adjusted | None]  # (change, up, diagnosis, conf, gain)
# a jump the rule's evidence sizes for one knob, beyond the next listed value: (knob, current value, listed
# values, history, diagnosis) -> (direction, value, expected effect in words), or None
SizedMove = Callable[[str, Any, list, "History", "Diagnosis | None"], "tuple[str, Any, str] | None"]


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


def clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def decode_at_limit(ev: Evidence) -> bool:
    """Decode running peaked at (>= 95 % of) its per-instance batch limit."""
    run_max, limit = ev.decode_running_max, ev.decode_batch_limit
    return run_max is not None and limit is not None and limit > 0 and run_max >= AT_LIMIT * limit


def decode_full(ev: Evidence) -> str | None:
    """Why decode cannot take more requests (batch limit reached, KV cache full), or None."""
    run_max, limit, kv = ev.decode_running_max, ev.decode_batch_limit, ev.decode_kv_usage_max
    if decode_at_limit(ev) and ev.decode_busy_slots_mean is None:
        return f"running {run_max:.0f} of a {limit:.0f} batch limit"
    waiting = ev.decode_waiting_mean
    # a peak nobody waits behind is not full
    if kv is not None and kv >= KV_PEAK_FULL and (waiting is None or waiting > WAITING_NEAR_ZERO):
        return f"KV cache usage {kv:.0%}"
    return None


def role_terms(ev: Evidence, term: str) -> dict[str, float]:
    """Share of each role's accounted device time spent in one breakdown term (e.g. imbalance_s, draft_s)."""
    out: dict[str, float] = {}
    for role, d in ev.breakdown.roles().items():
        got, total = d.seconds(term), d.accounted_s
        if got is not None and total > 0:
            out[role] = got / total
    return out
