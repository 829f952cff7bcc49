"""Decode capacity: decode runs at its batch limit with requests waiting; the queue also sizes how far the
limit should move (running + waiting per instance)."""
from __future__ import annotations

from typing import Any

from agent.planner.rules.base import Ctx, Hypothesis, MoveRule, Rule, clamp, decode_at_limit, num


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    pfor, pagainst, s = [], [], 0.15
    run_max, limit = num(ev, "decode_running_max"), num(ev, "decode_batch_limit")
    dmean, kv = num(ev, "decode_waiting_mean"), num(ev, "kv_usage_max")
    if decode_at_limit(ev) and dmean is not None and dmean > 0.5:
        pfor.append(f"decode running at its batch limit ({run_max:.0f}/{limit:.0f}) with {dmean:.1f} waiting")
        s += 0.55
    elif run_max is not None and limit:
        pagainst.append(f"decode running peaks at {run_max:.0f} of a {limit:.0f} batch limit")
        s -= 0.05
    busy = num(ev, "decode_busy_slots_mean")  # single-queue servers: slots in each decode step, read like running
    if busy is not None and limit:
        if busy >= 0.9 * limit and dmean is not None and dmean > 0.5:
            pfor.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step with {dmean:.1f} deferred")
            s += 0.1
        else:
            pagainst.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step")
    if kv is not None:
        if kv >= 0.95:
            pfor.append(f"KV cache usage reached {kv:.0%}")
            s += 0.3
        else:
            pagainst.append(f"KV cache usage peaked at {kv:.0%}")
    if dmean is not None and dmean <= 0.5:
        pagainst.append(f"decode waiting near zero (mean {dmean:.2f})")
        s -= 0.1
    return Hypothesis(name="decode_capacity", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


def decode_demand(ev: dict[str, Any]) -> float | None:
    """Running + waiting requests per decode instance, when decode runs at its batch limit with a queue."""
    run_mean, waiting = num(ev, "decode_running_mean"), num(ev, "decode_waiting_mean")
    if not decode_at_limit(ev) or run_mean is None or waiting is None or waiting <= 0.5:
        return None
    if num(ev, "decode_busy_slots_mean") is not None:
        return None  # one queue in front of the slots; deferred requests are not decode demand alone
    inst = num(ev, "decode_instances") or 1.0
    return run_mean + waiting / max(inst, 1.0)


def sized(knob: str, cur: Any, values: list, history: Any, diag: Any) -> tuple[str, Any, str] | None:
    """The decode batch limit raised to the demand the queue shows (running + waiting per instance), as an
    engineer would, when that is beyond the next listed value."""
    if knob != "max_num_seqs" or diag is None or diag.decode_demand is None or cur is None:
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
        ("num_decode_instances", "up"): MoveRule(
            hypotheses=("decode_capacity",), gain=0.25,
            mechanism="more decode instances add decode capacity", decision="P/D ratio",
            expected="higher throughput if decode bound", rules_out="the P/D ratio as the limit"),
        ("max_num_seqs", "up"): MoveRule(
            hypotheses=("decode_capacity",), gain=0.2,
            mechanism="a larger decode batch admits waiting requests", decision="whether the decode batch cap binds",
            expected="+10-25 % if decode runs at its cap with waiting requests; TPOT rises",
            rules_out="the decode batch cap as the limit"),
        ("index_cache_reuse", "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=0.15,
            mechanism="reusing the index cache across layers cuts decode compute (accuracy risk)",
            decision="whether the quality-risk speed-up is worth an accuracy evaluation",
            expected="lower TPOT, higher throughput; quality must be evaluated", rules_out="index cache reuse here"),
    })
