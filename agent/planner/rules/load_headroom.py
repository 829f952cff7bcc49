"""Load headroom: the offered load, not the server, caps the decode batch: headroom left under the goal's binding
latency limit (whichever it is: mean TPOT, a TTFT or TPOT tail; core/goalview.py), the server absorbs every request
the client allows, decode runs below its batch limit, and no queue forms inside."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import (
    AT_LIMIT, QUEUE_PERSISTENT, WAITING_NEAR_ZERO, WEAK, Ctx, Hypothesis, MoveRule, Rule, clamp, decode_full,
)
from agent.planner.tpot_fit import fits, line_limit
from core.knobs import CLIENT_CAP

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.history import History

LOAD_HEADROOM = 0.1  # the binding figure at least this far under its limit leaves room for more load
PRIOR = 0.1  # the scorer's start (a judgement): weak until headroom, C and decode's batch are read
C_FILLED = 0.85  # in flight at 85 % of C or more: C caps what is in flight (a judgement; client_supply asks 90 %)
W_HEADROOM = 0.2  # a scorer weight (judgement): headroom at the line at all, before how much of it there is
W_MORE_HEADROOM = 0.4  # a scorer weight (judgement): the rest of headroom's weight, earned linearly up to HEADROOM_SPAN
HEADROOM_SPAN = 0.3  # headroom 30 % past the line (40 % in all) earns W_MORE_HEADROOM in full (a judgement)
W_TIGHT = 0.1  # a scorer weight (judgement): too little latency headroom for more load
W_QUEUED = 0.6  # a scorer weight (judgement): a queue inside the server sinks the hypothesis to weak (0.2 at most)
W_C_CAPS = 0.15  # a scorer weight (judgement): in flight ≈ C, so C is what caps the load
W_C_SLACK = 0.4  # a scorer weight (judgement): in flight well under C, so C is not what caps the load
W_DECODE_FULL = 0.6  # a scorer weight (judgement): decode already at its batch limit with a queue sinks it to weak
W_BATCH_ROOM = 0.1  # a scorer weight (judgement): decode's batch peaks below its limit, room to batch more
GAIN_C_UP = 0.2  # the move's prior gain (a judgement): bigger decode batches while TPOT has headroom


def score(ctx: Ctx) -> Hypothesis:
    s, ev, head, ruled_out = ctx.summary, ctx.ev, ctx.headroom, ctx.ruled_out
    pfor, pagainst, sc = [], [], PRIOR
    if head is None:
        return Hypothesis(name="load_headroom", likelihood=WEAK, evidence_against=["no latency figure or no limit"])
    words = ctx.limit.words if ctx.limit is not None else "latency"
    if head >= LOAD_HEADROOM:
        pfor.append(f"{words} leaves {head:.0%} headroom: more load still meets the limit")
        sc += W_HEADROOM + W_MORE_HEADROOM * min(1.0, (head - LOAD_HEADROOM) / HEADROOM_SPAN)
    else:
        pagainst.append(f"{words} leaves only {head:.0%} headroom")
        sc -= W_TIGHT
    pshare = ev.prefill_waiting_nonzero_share
    queued = pshare is not None and pshare >= QUEUE_PERSISTENT and "prefill_supply" not in ruled_out \
        and not decode_full(ev)
    if queued:
        pagainst.append(f"prefill queue non-empty in {pshare:.0%} of samples: more load would queue before prefill")
        sc -= W_QUEUED
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency and not queued:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio >= C_FILLED:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: C caps what is in flight")
            sc += W_C_CAPS
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} is only {ratio:.0%} of "
                            f"C={s.concurrency}: C is not what caps the load")
            sc -= W_C_SLACK
    run_max, limit = ev.decode_running_max, ev.decode_batch_limit
    dmean = ev.decode_waiting_mean
    if run_max is not None and limit:
        if run_max >= AT_LIMIT * limit and dmean is not None and dmean > WAITING_NEAR_ZERO \
                and "decode_capacity" in ruled_out:
            pfor.append("decode waits at its batch limit, but raising the limit here changed nothing")
        elif run_max >= AT_LIMIT * limit and dmean is not None and dmean > WAITING_NEAR_ZERO:
            pagainst.append(f"decode already at its batch limit ({run_max:.0f}/{limit:.0f}) with requests waiting")
            sc -= W_DECODE_FULL
        elif run_max < AT_LIMIT * limit:
            pfor.append(f"decode batch peaks at {run_max:.0f} of a {limit:.0f} limit: room to batch more")
            sc += W_BATCH_ROOM
    return Hypothesis(name="load_headroom", likelihood=clamp(sc), evidence_for=pfor, evidence_against=pagainst)


def room_for(history: History, head: float | None, target: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether a load raise to `target` (a coupled C + max_num_seqs step of the best station) has room under the
    binding limit: 10 % headroom, or, under that, where the binding limit is on the decode side, a line of its figure
    against the decode batch fitted from the runs made (agent/planner/tpot_fit.py) that gives it a fair chance of
    staying under the limit (then the line's words)."""
    if head is None or head >= LOAD_HEADROOM:
        return True, None
    bound = line_limit(history)
    line = fits(history, target, bound) if bound is not None else None
    return line is not None, (f"{head:.0%} latency headroom, but {line}" if line else None)


RULE = Rule(
    name="load_headroom",
    prompt=("load_headroom: TPOT headroom with achieved concurrency ≈ C, decode below its batch limit and no queue "
            "inside the server: raise C (a hot move) before restarting anything."),
    score=score, separable=False,
    moves={
        (CLIENT_CAP, "up"): MoveRule(
            hypotheses=("client_supply", "load_headroom"), gain=GAIN_C_UP,
            mechanism="a higher concurrency cap keeps more requests in flight: bigger decode batches while TPOT has headroom",
            decision="whether the offered load, not the server, limits throughput",
            expected="higher throughput if achieved concurrency ≈ C and decode runs below its batch limit; TPOT rises",
            rules_out="the concurrency cap as the limit at this station"),
    })
