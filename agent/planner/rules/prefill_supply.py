"""Prefill supply: prefill cannot feed decode fast enough (a busy prefill queue while decode is starved); which
per-batch limit binds (the request cap or the token budget) is read from the prefill batch composition."""
from __future__ import annotations

from typing import Any

from agent.planner.rules.base import Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, decode_full, num

BUDGET_FULL = 0.95  # prefill batches using this share of the token budget on average: the budget binds
CAP_FULL = 0.95  # carrying this share of the request cap on average (with budget to spare): the cap binds
# a bigger prefill budget when the request cap binds only trims the tail chunks: this share of its confidence
BUDGET_NOT_BINDING = 0.5
BUDGET_SPARE = 0.5  # batches using under this share of the token budget on average: a prompt fits with room to spare
BUDGET_KNOBS = ("max_num_batched_tokens", "chunked_prefill_size")  # the prefill token budget, by engine
BUSY = 0.9  # prefill instances busy this share of the run: saturated, so their count sets the supply
MAX_SCALE = 2.0  # an instance jump at most doubles the supply: past that, decode's TPOT is an extrapolation


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    pfor, pagainst, s = [], [], 0.2
    pshare, pmean = num(ev, "prefill_waiting_nonzero_share"), num(ev, "prefill_waiting_mean")
    dshare, dmean = num(ev, "decode_waiting_nonzero_share"), num(ev, "decode_waiting_mean")
    tail = num(ev, "prefill_tail_batch_share")
    breqs = num(ev, "prefill_batch_reqs_mean")
    if pshare is not None:
        if pshare >= 0.5:
            pfor.append(f"prefill queue non-empty in {pshare:.0%} of samples (mean {pmean or 0:.1f} waiting)")
            s += 0.4 * min(1.0, pshare / 0.8)
        else:
            pagainst.append(f"prefill queue non-empty in only {pshare:.0%} of samples")
            s -= 0.15
    full = decode_full(ev)
    if full:
        pagainst.append(f"decode is full ({full}): the prefill queue is back-pressure from decode")
        s -= 0.45
    if dmean is not None:
        if dmean <= 0.5 and (dshare is None or dshare < 0.2) and not full:
            pfor.append(f"decode waiting near zero (mean {dmean:.2f}): decode is starved, not saturated")
            s += 0.2
        else:
            pagainst.append(f"decode also has waiting requests (mean {dmean:.1f})")
            s -= 0.2
    if tail is not None and tail >= 0.2:
        pfor.append(f"{tail:.0%} of prefill batches are tail chunks using < 1/8 of the token budget")
        s += 0.1
    if breqs is not None and breqs <= 1.05 and (pshare or 0) >= 0.5:
        pfor.append(f"prefill batches carry {breqs:.2f} requests on average while requests wait")
        s += 0.05
    if num(ev, "decode_busy_slots_mean") is not None and (pshare or 0) > 0:
        # one queue (deferred requests) in front of the slots: waiting means waiting for a slot
        pagainst.append("single-queue server: deferred requests wait for a free slot, not for prefill")
        s -= 0.2
    return Hypothesis(name="prefill_supply", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


def budget_of(knobs: dict[str, Any]) -> Any:
    """The station's prefill token budget (vLLM's max_num_batched_tokens or SGLang's chunked_prefill_size)."""
    return next((knobs[k] for k in BUDGET_KNOBS if knobs.get(k)), None)


def prefill_limit(ev: dict[str, Any], knobs: dict[str, Any]) -> tuple[str | None, str | None, float | None]:
    """Which per-batch limit fills the prefill batches (the token budget, the request cap, or neither: None), why,
    and the share of the budget the batches use on average (None without batch records or a budget)."""
    budget = budget_of(knobs)
    cap = knobs.get("max_prefill_reqs")
    reqs, toks = num(ev, "prefill_batch_reqs_mean"), num(ev, "prefill_batch_tokens_mean")
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


def value(change: Any, up: bool, diag: Any, conf: float, gain: float) -> Adjusted | None:
    """Cap vs budget: a bigger budget while the cap binds keeps half its confidence; a bigger budget while the
    batches use under half of it and no limit binds adds no tokens to them (nothing to gain, nothing new asked);
    a higher cap while the batches already fill the budget gains at most the unused share of the budget."""
    knob = change.knob
    if not up:
        return None
    fill = diag.prefill_budget_fill
    if knob in BUDGET_KNOBS and diag.prefill_limit is None \
            and fill is not None and fill < BUDGET_SPARE:
        return Adjusted(conf, 0.0, f" (gain 0: prefill batches use {fill:.0%} of the token budget on average and "
                                   f"no per-batch limit binds, so a bigger budget adds no tokens to them)",
                        answered=True)
    if knob in BUDGET_KNOBS and diag.prefill_limit == "request_cap":
        return Adjusted(conf * BUDGET_NOT_BINDING, gain,
                        f" × {BUDGET_NOT_BINDING} = {conf * BUDGET_NOT_BINDING:.2f} ({diag.prefill_limit_why})")
    if knob == "max_prefill_reqs" and diag.prefill_limit == "token_budget" and fill is not None:
        return Adjusted(conf, min(gain, max(0.0, 1.0 - fill)),
                        f" (gain bounded by the unused budget: {diag.prefill_limit_why})", answered=True)
    return None


def sized(knob: str, cur: Any, values: list, history: Any, diag: Any) -> tuple[str, Any, str] | None:
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
    ev = ref.evidence or {}
    ups = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cur)
    if len(ups) < 2:
        return None
    if knob in BUDGET_KNOBS:
        prompt = ref.summary.prompt_uncached_mean
        if diag.prefill_limit != "token_budget" or not prompt or prompt <= cur:
            return None
        target = next((v for v in ups if v >= prompt), ups[-1])
        why = (f"{diag.prefill_limit_why}; the mean uncached prompt is {prompt:.0f} tokens, so a budget of {cur} "
               f"splits each into {-(-prompt // cur):.0f} passes: {target} holds one in a single pass")
    elif knob == "max_prefill_reqs":
        prompt = ref.summary.prompt_uncached_mean
        budget = budget_of(history.best_knobs)
        waiting, inst = num(ev, "prefill_waiting_mean"), num(ev, "prefill_instances") or 1.0
        if diag.prefill_limit != "request_cap" or not prompt or not budget or waiting is None:
            return None
        holds = float(budget) / prompt
        queued = cur + max(1.0, waiting / inst)
        target = max((v for v in ups if v <= min(holds, queued)), default=ups[0])
        why = (f"{diag.prefill_limit_why}; a {budget}-token budget holds {holds:.1f} mean uncached prompts "
               f"({prompt:.0f} tokens) and {waiting / inst:.1f} wait per prefill instance on average, so a cap of {target} "
               f"fills the pass")
    elif knob == "num_prefill_instances":
        waiting, running = num(ev, "prefill_waiting_mean"), num(ev, "decode_running_total_mean")
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
        ("max_prefill_reqs", "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=0.3,
            mechanism="more requests per prefill pass amortise the fixed per-pass cost and fill the tail chunks",
            decision="whether prefill batch composition, not decode concurrency, limits throughput",
            expected="+20-40 % output tok/s per card if prefill supply is the bottleneck; TPOT about unchanged",
            rules_out="per-pass prefill overhead as the limit: prefill supply would need more P instances or budget"),
        ("max_num_batched_tokens", "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=0.12,
            mechanism="a larger prefill token budget processes more prompt tokens per pass",
            decision="whether the prefill chunk size limits prefill supply",
            expected="+5-15 % if prefill is compute-underused per pass; TTFT of long prompts may fall",
            rules_out="chunk size as the prefill limit"),
        ("num_prefill_instances", "up"): MoveRule(
            hypotheses=("prefill_supply",), gain=0.25,
            mechanism="more prefill instances add prefill capacity", decision="P/D ratio",
            expected="higher throughput if prefill bound; fewer cards for decode",
            rules_out="the P/D ratio as the limit"),
    })
