"""Decode capacity: decode runs at its batch limit with requests waiting; the queue also sizes how far the
limit should move (running + waiting per instance)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import KV_FULL, WAITING_NEAR_ZERO, Ctx, Hypothesis, MoveRule, Rule, clamp, decode_at_limit
from core.knobs import BATCH_CAP, DECODE_INSTANCES, INDEX_REUSE, role_of
from core.evidence import Evidence

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

PRIOR = 0.15  # the scorer's start (a judgement): weak until decode's batch limit and queue are read
# mean busy slots per decode step (a mean, not a peak like AT_LIMIT, so a lower bar) at 90 % of the slots: full
SLOTS_BUSY = 0.9  # single-queue servers: the slots, read like running, are what admits requests
W_AT_LIMIT = 0.55  # a scorer weight (judgement): at the batch limit with a queue, the direct sign (0.7: supported)
W_BELOW_LIMIT = 0.05  # a nudge against (judgement): decode's running peak stays below its batch limit
W_SLOTS_BUSY = 0.1  # a scorer weight (judgement): busy slots with deferred requests back the batch-limit reading
W_KV_FULL = 0.3  # a scorer weight (judgement): a full KV cache limits decode too (kv_capacity weighs the lever)
W_NO_QUEUE = 0.1  # a scorer weight (judgement): nothing waits for decode, so more decode capacity has nothing to take
GAIN_DECODE_INSTANCES = 0.25  # the move's prior gain (a judgement): one more decode instance adds decode capacity
GAIN_BATCH_CAP = 0.2  # the move's prior gain: inside its stated +10-25 % when decode runs at its cap with a queue
GAIN_INDEX_REUSE = 0.15  # the move's prior gain (a judgement): less decode compute, discounted for its accuracy risk


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    pfor, pagainst, s = [], [], PRIOR
    run_max, limit = ev.decode_running_max, ev.decode_batch_limit
    dmean, kv = ev.decode_waiting_mean, ev.decode_kv_usage_max
    if decode_at_limit(ev) and dmean is not None and dmean > WAITING_NEAR_ZERO:
        pfor.append(f"decode running at its batch limit ({run_max:.0f}/{limit:.0f}) with {dmean:.1f} waiting")
        s += W_AT_LIMIT
    elif run_max is not None and limit:
        pagainst.append(f"decode running peaks at {run_max:.0f} of a {limit:.0f} batch limit")
        s -= W_BELOW_LIMIT
    busy = ev.decode_busy_slots_mean  # single-queue servers: slots in each decode step, read like running
    if busy is not None and limit:
        if busy >= SLOTS_BUSY * limit and dmean is not None and dmean > WAITING_NEAR_ZERO:
            pfor.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step with {dmean:.1f} deferred")
            s += W_SLOTS_BUSY
        else:
            pagainst.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step")
    if kv is not None:
        if kv >= KV_FULL:
            pfor.append(f"KV cache usage reached {kv:.0%}")
            s += W_KV_FULL
        else:
            pagainst.append(f"KV cache usage peaked at {kv:.0%}")
    if dmean is not None and dmean <= WAITING_NEAR_ZERO:
        pagainst.append(f"decode waiting near zero (mean {dmean:.2f})")
        s -= W_NO_QUEUE
    return Hypothesis(name="decode_capacity", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


def decode_demand(ev: Evidence) -> float | None:
    """Running + waiting requests per decode instance, when decode runs at its batch limit with a queue."""
    run_mean, waiting = ev.decode_running_mean, ev.decode_waiting_mean
    if not decode_at_limit(ev) or run_mean is None or waiting is None or waiting <= WAITING_NEAR_ZERO:
        return None
    if ev.decode_busy_slots_mean is not None:
        return None  # one queue in front of the slots; deferred requests are not decode demand alone
    inst = ev.decode_instances or 1.0
    return run_mean + waiting / max(inst, 1.0)


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """The decode batch limit raised to the demand the queue shows (running + waiting per instance), as an
    engineer would, when that is beyond the next listed value."""
    if role_of(knob) != BATCH_CAP or diag is None or diag.decode_demand is None or cur is None:
        return None
    ups = sorted(v for v in values if v is not None and v > cur)
    if len(ups) < 2:
        return None
    target = next((v for v in ups if v >= diag.decode_demand), ups[-1])
    if target == ups[0]:
        return None
    return "up", target, (f"decode demand ≈ {diag.decode_demand:.0f} requests per instance at a limit of {cur}: "
                          f"a limit of {target} admits it; TPOT rises")


RULE = Rule(
    name="decode_capacity",
    prompt=("decode_capacity: decode running at its batch limit with waiting requests; the queue (running + "
            "waiting per instance) sizes the new limit."),
    score=score, sized=sized,
    moves={
        (DECODE_INSTANCES, "up"): MoveRule(
            hypotheses=("decode_capacity",), gain=GAIN_DECODE_INSTANCES,
            mechanism="more decode instances add decode capacity", decision="P/D ratio",
            expected="higher throughput if decode bound", rules_out="the P/D ratio as the limit"),
        (BATCH_CAP, "up"): MoveRule(
            hypotheses=("decode_capacity",), gain=GAIN_BATCH_CAP,
            mechanism="a larger decode batch admits waiting requests", decision="whether the decode batch cap binds",
            expected="+10-25 % if decode runs at its cap with waiting requests; TPOT rises",
            rules_out="the decode batch cap as the limit"),
        (INDEX_REUSE, "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=GAIN_INDEX_REUSE,
            mechanism="reusing the index cache across layers cuts decode compute (accuracy risk)",
            decision="whether the quality-risk speed-up is worth an accuracy evaluation",
            expected="lower TPOT, higher throughput; quality must be evaluated", rules_out="index cache reuse here"),
    })
