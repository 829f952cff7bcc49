"""Prefill supply: prefill cannot feed decode fast enough (a busy prefill queue while decode is starved); which
per-batch limit binds (the request cap or the token budget) is read from the prefill batch composition."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import (
    QUEUE_PERSISTENT, WAITING_NEAR_ZERO, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, decode_full,
)
from core.knobs import PREFILL_INSTANCES, PREFILL_REQUEST_CAP, PREFILL_TOKEN_BUDGET, by_role, role_of
from core.evidence import Evidence

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

BUDGET_FULL = 0.95  # prefill batches using this share of the token budget on average: the budget binds
CAP_FULL = 0.95  # carrying this share of the request cap on average (with budget to spare): the cap binds
# a bigger prefill budget when the request cap binds only trims the tail chunks: half of its confidence (a judgement)
BUDGET_NOT_BINDING = 0.5  # the share of its confidence a budget raise keeps while the request cap binds
BUDGET_SPARE = 0.5  # batches using under this share of the token budget on average: a prompt fits with room to spare
BUDGET_KNOBS = frozenset({PREFILL_TOKEN_BUDGET})  # the role of the prefill token budget, whatever the engine calls it
BUSY = 0.9  # prefill instances busy this share of the run: saturated, so their count sets the supply
MAX_SCALE = 2.0  # an instance jump at most doubles the supply: past that, decode's TPOT is an extrapolation
PRIOR = 0.2  # the scorer's start (a judgement): weak until the prefill and decode queues are read
QUEUE_SATURATED = 0.8  # the prefill queue non-empty in 80 % of the samples earns W_QUEUE in full (a judgement)
DECODE_QUEUE_RARE = 0.2  # decode's queue non-empty in under a fifth of the samples: decode is starved (a judgement)
TAIL_SHARE = 0.2  # a fifth of prefill batches or more are tail chunks (< 1/8 of the budget): part-empty (judgement)
ONE_REQUEST = 1.05  # prefill batches carrying about one request on average (5 % slack for the odd pair: judgement)
W_QUEUE = 0.4  # a scorer weight (judgement): a persistent prefill queue, the direct sign (0.6 at saturation)
W_QUEUE_RARE = 0.15  # a scorer weight (judgement): the prefill queue is mostly empty
W_DECODE_FULL = 0.45  # a scorer weight (judgement): a full decode makes the prefill queue back-pressure, not supply
W_DECODE_STARVED = 0.2  # a scorer weight (judgement): decode waits for nothing, so it is starved, not saturated
W_DECODE_QUEUED = 0.2  # a scorer weight (judgement): decode has its own queue, so prefill is not what starves it
W_TAIL = 0.1  # a scorer weight (judgement): tail chunks waste a pass's fixed cost
W_ONE_REQUEST = 0.05  # a nudge (judgement): one request per pass while others wait, the request cap may bind
W_SINGLE_QUEUE = 0.2  # a scorer weight (judgement): on a single-queue server a waiting request waits for a slot
GAIN_REQUEST_CAP = 0.3  # the move's prior gain: inside its stated +20-40 % where prefill supply is the bottleneck
GAIN_TOKEN_BUDGET = 0.12  # the move's prior gain: inside its stated +5-15 % where prefill is compute-underused per pass
GAIN_PREFILL_INSTANCES = 0.25  # the move's prior gain (a judgement): a prefill instance more adds prefill capacity


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    pfor, pagainst, s = [], [], PRIOR
    pshare, pmean = ev.prefill_waiting_nonzero_share, ev.prefill_waiting_mean
    dshare, dmean = ev.decode_waiting_nonzero_share, ev.decode_waiting_mean
    tail = ev.prefill_tail_batch_share
    breqs = ev.prefill_batch_reqs_mean
    if pshare is not None:
        if pshare >= QUEUE_PERSISTENT:
            pfor.append(f"prefill queue non-empty in {pshare:.0%} of samples (mean {pmean or 0:.1f} waiting)")
            s += W_QUEUE * min(1.0, pshare / QUEUE_SATURATED)
        else:
            pagainst.append(f"prefill queue non-empty in only {pshare:.0%} of samples")
            s -= W_QUEUE_RARE
    full = decode_full(ev)
    if full:
        pagainst.append(f"decode is full ({full}): the prefill queue is back-pressure from decode")
        s -= W_DECODE_FULL
    if dmean is not None:
        if dmean <= WAITING_NEAR_ZERO and (dshare is None or dshare < DECODE_QUEUE_RARE) and not full:
            pfor.append(f"decode waiting near zero (mean {dmean:.2f}): decode is starved, not saturated")
            s += W_DECODE_STARVED
        else:
            pagainst.append(f"decode also has waiting requests (mean {dmean:.1f})")
            s -= W_DECODE_QUEUED
    if tail is not None and tail >= TAIL_SHARE:
        pfor.append(f"{tail:.0%} of prefill batches are tail chunks using < 1/8 of the token budget")
        s += W_TAIL
    if breqs is not None and breqs <= ONE_REQUEST and (pshare or 0) >= QUEUE_PERSISTENT:
        pfor.append(f"prefill batches carry {breqs:.2f} requests on average while requests wait")
        s += W_ONE_REQUEST
    if ev.decode_busy_slots_mean is not None and (pshare or 0) > 0:
        # one queue (deferred requests) in front of the slots: waiting means waiting for a slot
        pagainst.append("single-queue server: deferred requests wait for a free slot, not for prefill")
        s -= W_SINGLE_QUEUE
    return Hypothesis(name="prefill_supply", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


def budget_of(knobs: dict[str, Any]) -> Any:
    """The station's prefill token budget: the value of the knob playing the prefill token budget role (vLLM's
    --max-num-batched-tokens, SGLang's --chunked-prefill-size), None when absent or 0."""
    return by_role(knobs, PREFILL_TOKEN_BUDGET) or None


def prefill_limit(ev: Evidence, knobs: dict[str, Any]) -> tuple[str | None, str | None, float | None]:
    """Which per-batch limit fills the prefill batches (the token budget, the request cap, or neither: None), why,
    and the share of the budget the batches use on average (None without batch records or a budget)."""
    budget = budget_of(knobs)
    cap = by_role(knobs, PREFILL_REQUEST_CAP)
    reqs, toks = ev.prefill_batch_reqs_mean, ev.prefill_batch_tokens_mean
    if toks is None or not budget:
        return None, None, None
    fill = toks / float(budget)
    if fill >= BUDGET_FULL:
        return "token_budget", (f"prefill batches fill {fill:.0%} of the {budget}-token budget: a higher request "
                                f"cap cannot add tokens to a full batch"), fill
    if cap and reqs is not None and reqs >= CAP_FULL * cap:
        return "request_cap", (f"prefill batches carry {reqs:.2f} requests at a cap of {cap} and use only "
                               f"{fill:.0%} of the token budget: the request cap binds"), fill
    return None, None, fill


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    """Cap vs budget: a bigger budget while the cap binds keeps half its confidence; a bigger budget while the
    batches use under half of it and no limit binds adds no tokens to them (nothing to gain, nothing new asked);
    a higher cap while the batches already fill the budget gains at most the unused share of the budget."""
    role = role_of(change.knob)
    if not up:
        return None
    fill = diag.prefill_budget_fill
    if role in BUDGET_KNOBS and diag.prefill_limit is None \
            and fill is not None and fill < BUDGET_SPARE:
        return Adjusted(conf, 0.0, f" (gain 0: prefill batches use {fill:.0%} of the token budget on average and "
                                   f"no per-batch limit binds, so a bigger budget adds no tokens to them)",
                        answered=True)
    if role in BUDGET_KNOBS and diag.prefill_limit == "request_cap":
        return Adjusted(conf * BUDGET_NOT_BINDING, gain,
                        f" × {BUDGET_NOT_BINDING} = {conf * BUDGET_NOT_BINDING:.2f} ({diag.prefill_limit_why})")
    if role == PREFILL_REQUEST_CAP and diag.prefill_limit == "token_budget" and fill is not None:
        return Adjusted(conf, min(gain, max(0.0, 1.0 - fill)),
                        f" (gain bounded by the unused budget: {diag.prefill_limit_why})", answered=True)
    return None


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """Where the token budget binds: a budget that holds the mean uncached prompt in one pass (a smaller one splits
    every prompt into chunks that each pay a pass's fixed cost). Where the request cap binds with budget to spare:
    the cap that fills the budget with mean uncached prompts (budget / prompt: past it the budget binds instead),
    at most the requests there are to batch (the cap plus those waiting per prefill instance, at least one more).
    Where the prefill instances are saturated with
    requests queueing for them and decode has room: the instance count scaled by the supply the queue asks for
    ((prefill waiting + decode running) / decode running: everything queued moves to decode), at most doubled.
    Each only when beyond the next listed value."""
    if diag is None or not isinstance(cur, (int, float)) or isinstance(cur, bool):
        return None
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None:
        return None
    ev = ref.evidence
    ups = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cur)
    if len(ups) < 2:
        return None
    role = role_of(knob)
    if role in BUDGET_KNOBS:
        prompt = ref.summary.prompt_uncached_mean
        if diag.prefill_limit != "token_budget" or not prompt or prompt <= cur:
            return None
        target = next((v for v in ups if v >= prompt), ups[-1])
        why = (f"{diag.prefill_limit_why}; the mean uncached prompt is {prompt:.0f} tokens, so a budget of {cur} "
               f"splits each into {-(-prompt // cur):.0f} passes: {target} holds one in a single pass")
    elif role == PREFILL_REQUEST_CAP:
        prompt = ref.summary.prompt_uncached_mean
        budget = budget_of(history.best_knobs)
        waiting, inst = ev.prefill_waiting_mean, ev.prefill_instances or 1.0
        if diag.prefill_limit != "request_cap" or not prompt or not budget or waiting is None:
            return None
        holds = float(budget) / prompt
        queued = cur + max(1.0, waiting / inst)
        target = max((v for v in ups if v <= min(holds, queued)), default=ups[0])
        why = (f"{diag.prefill_limit_why}; a {budget}-token budget holds {holds:.1f} mean uncached prompts "
               f"({prompt:.0f} tokens) and {waiting / inst:.1f} wait per prefill instance on average, so a cap of {target} "
               f"fills the pass")
    elif role == PREFILL_INSTANCES:
        waiting, running = ev.prefill_waiting_mean, ev.decode_running_total_mean
        if diag.prefill_busy is None or diag.prefill_busy < BUSY or not waiting or not running or decode_full(ev):
            return None
        scale = min(MAX_SCALE, (waiting + running) / running)
        target = max((v for v in ups if v <= cur * scale), default=ups[0])
        why = (f"prefill busy {diag.prefill_busy:.0%} with {waiting:.0f} requests waiting for it and {running:.0f} "
               f"running in decode: supply x{(waiting + running) / running:.1f} would move the queue to decode "
               f"(at most x{MAX_SCALE:g} per move), so {cur} -> {target} instances")
    else:
        return None
    return None if target == ups[0] else ("up", target, why)


RULE = Rule(
    name="prefill_supply",
    prompt=("prefill_supply: a prefill queue persistently non-empty while decode waiting is near zero; prefill "
            "batches that fill the token budget call for budget (or P instances), batches at the request cap with "
            "budget to spare call for a higher cap."),
    score=score, value=value, sized=sized,
    moves={
        (PREFILL_REQUEST_CAP, "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=GAIN_REQUEST_CAP,
            mechanism="more requests per prefill pass amortise the fixed per-pass cost and fill the tail chunks",
            decision="whether prefill batch composition, not decode concurrency, limits throughput",
            expected="+20-40 % output tok/s per card if prefill supply is the bottleneck; TPOT about unchanged",
            rules_out="per-pass prefill overhead as the limit: prefill supply would need more P instances or budget"),
        (PREFILL_TOKEN_BUDGET, "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=GAIN_TOKEN_BUDGET,
            mechanism="a larger prefill token budget processes more prompt tokens per pass",
            decision="whether the prefill chunk size limits prefill supply",
            expected="+5-15 % if prefill is compute-underused per pass; TTFT of long prompts may fall",
            rules_out="chunk size as the prefill limit"),
        (PREFILL_INSTANCES, "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=GAIN_PREFILL_INSTANCES,
            mechanism="more prefill instances add prefill capacity", decision="P/D ratio",
            expected="higher throughput if prefill bound; fewer cards for decode",
            rules_out="the P/D ratio as the limit"),
    })
