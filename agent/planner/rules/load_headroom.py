"""Load headroom: the offered load, not the server, caps the decode batch: latency headroom left, the server
absorbs every request the client allows, decode runs below its batch limit, and no queue forms inside."""
from __future__ import annotations

from typing import Any

from agent.planner.rules.base import Ctx, Hypothesis, MoveRule, Rule, clamp, decode_full, num
from agent.planner.tpot_fit import fits

LOAD_HEADROOM = 0.1  # TPOT at least this far under its limit leaves room for a bigger decode batch


def score(ctx: Ctx) -> Hypothesis:
    s, ev, head, ruled_out = ctx.summary, ctx.ev, ctx.headroom, ctx.ruled_out
    pfor, pagainst, sc = [], [], 0.1
    if head is None:
        return Hypothesis(name="load_headroom", likelihood=0.1, evidence_against=["no TPOT figure or no limit"])
    if head >= LOAD_HEADROOM:
        pfor.append(f"mean TPOT leaves {head:.0%} headroom: a bigger decode batch still meets the limit")
        sc += 0.2 + 0.4 * min(1.0, (head - LOAD_HEADROOM) / 0.3)
    else:
        pagainst.append(f"mean TPOT leaves only {head:.0%} headroom")
        sc -= 0.1
    pshare = num(ev, "prefill_waiting_nonzero_share")
    queued = pshare is not None and pshare >= 0.5 and "prefill_supply" not in ruled_out and not decode_full(ev)
    if queued:
        pagainst.append(f"prefill queue non-empty in {pshare:.0%} of samples: more load would queue before prefill")
        sc -= 0.6
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency and not queued:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio >= 0.85:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: C caps what is in flight")
            sc += 0.15
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} is only {ratio:.0%} of "
                            f"C={s.concurrency}: C is not what caps the load")
            sc -= 0.4
    run_max, limit = num(ev, "decode_running_max"), num(ev, "decode_batch_limit")
    dmean = num(ev, "decode_waiting_mean")
    if run_max is not None and limit:
        if run_max >= 0.95 * limit and dmean is not None and dmean > 0.5 and "decode_capacity" in ruled_out:
            pfor.append("decode waits at its batch limit, but raising the limit here changed nothing")
        elif run_max >= 0.95 * limit and dmean is not None and dmean > 0.5:
            pagainst.append(f"decode already at its batch limit ({run_max:.0f}/{limit:.0f}) with requests waiting")
            sc -= 0.6
        elif run_max < 0.95 * limit:
            pfor.append(f"decode batch peaks at {run_max:.0f} of a {limit:.0f} limit: room to batch more")
            sc += 0.1
    return Hypothesis(name="load_headroom", likelihood=clamp(sc), evidence_for=pfor, evidence_against=pagainst)


def room_for(history: Any, head: float | None, target: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether a load raise to `target` (a coupled C + max_num_seqs step of the best station) has room under the
    TPOT limit: 10 % headroom, or, under that, a TPOT line fitted from the runs made (agent/planner/tpot_fit.py) that
    gives it a fair chance of staying under the limit (then the line's words)."""
    if head is None or head >= LOAD_HEADROOM:
        return True, None
    line = fits(history, target, history.goal.constraints.tpot_mean_ms_lt)
    return line is not None, (f"{head:.0%} TPOT headroom, but {line}" if line else None)


RULE = Rule(
    name="load_headroom",
    prompt=("load_headroom: TPOT headroom with achieved concurrency ≈ C, decode below its batch limit and no queue "
            "inside the server: raise C (a hot move) before restarting anything."),
    score=score, separable=False,
    moves={
        ("concurrency", "up"): MoveRule(
            hypotheses=("client_supply", "load_headroom"), gain=0.2,
            mechanism="a higher concurrency cap keeps more requests in flight: bigger decode batches while TPOT has headroom",
            decision="whether the offered load, not the server, limits throughput",
            expected="higher throughput if achieved concurrency ≈ C and decode runs below its batch limit; TPOT rises",
            rules_out="the concurrency cap as the limit at this station"),
    })
