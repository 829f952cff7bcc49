"""Explain the evidence before choosing a knob: named hypotheses with evidence for and against.

Pure: a Summary, the evidence digest (executor.evidence.digest keys) and the goal's latency limit in,
a Diagnosis out. Thresholds are coarse on purpose; the planner only needs to rank explanations and
know when the queue evidence cannot separate them (then, and only then, a profile is worth asking for).
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.summary import Summary

HypothesisName = Literal[
    "prefill_supply", "client_supply", "decode_capacity", "spec_acceptance", "expert_imbalance", "latency_bound",
    "load_headroom",
]
HYPOTHESES: tuple[str, ...] = (
    "prefill_supply", "client_supply", "decode_capacity", "spec_acceptance", "expert_imbalance", "latency_bound",
    "load_headroom",
)
LOAD_HEADROOM = 0.1  # TPOT at least this far under its limit leaves room for a bigger decode batch
SUPPORTED, OPEN_LOW = 0.6, 0.3  # likelihood bands: supported >= 0.6 > open >= 0.3 > weak
SEPARATION = 0.15  # two supported hypotheses closer than this cannot be told apart from queues alone


class Hypothesis(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: HypothesisName
    likelihood: float = Field(ge=0.0, le=1.0)
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)

    @property
    def status(self) -> str:
        if self.likelihood >= SUPPORTED:
            return "supported"
        return "open" if self.likelihood >= OPEN_LOW else "weak"


class Diagnosis(BaseModel):
    model_config = ConfigDict(frozen=True)
    hypotheses: list[Hypothesis]
    propose_profile: bool = False
    profile_reason: str | None = None
    tpot_headroom: float | None = None  # 1 - mean TPOT / limit
    # which prefill batch limit binds (batch composition evidence): "token_budget" when batches already fill
    # the token budget (a higher request cap cannot add tokens), "request_cap" when they carry the cap's
    # requests with budget to spare; None when the evidence does not say
    prefill_limit: Literal["token_budget", "request_cap"] | None = None
    prefill_limit_why: str | None = None
    prefill_budget_fill: float | None = None  # mean prefill batch tokens / token budget
    # which client limit binds: "request_rate" (QPS ≈ r with free concurrency slots: a higher C adds nothing)
    # or "concurrency" (in flight ≈ C: a higher r only queues at the sender); None when neither clearly
    client_limit: Literal["request_rate", "concurrency"] | None = None
    client_limit_why: str | None = None
    # requests per decode instance that want to run (running + waiting) when decode sits at its batch limit:
    # the queue sizes how far the limit should move, not only which way
    decode_demand: float | None = None

    def get(self, name: str) -> Hypothesis:
        return next(h for h in self.hypotheses if h.name == name)

    def likelihood(self, name: str) -> float:
        return self.get(name).likelihood

    @property
    def leading(self) -> Hypothesis:
        return max(self.hypotheses, key=lambda h: h.likelihood)

    def text(self) -> str:
        lines = []
        for h in sorted(self.hypotheses, key=lambda h: -h.likelihood):
            lines.append(f"{h.name} [{h.status} {h.likelihood:.2f}]")
            lines += [f"  + {e}" for e in h.evidence_for]
            lines += [f"  - {e}" for e in h.evidence_against]
        if self.propose_profile:
            lines.append(f"profile capture: {self.profile_reason}")
        return "\n".join(lines)


def _num(ev: dict[str, Any], key: str) -> float | None:
    v = ev.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def decode_at_limit(ev: dict[str, Any]) -> bool:
    """Decode running peaked at (>= 95 % of) its per-instance batch limit."""
    run_max, limit = _num(ev, "decode_running_max"), _num(ev, "decode_batch_limit")
    return run_max is not None and limit is not None and limit > 0 and run_max >= 0.95 * limit


def decode_full(ev: dict[str, Any]) -> str | None:
    """Why decode cannot take more requests (batch limit reached, KV cache full), or None."""
    run_max, limit, kv = _num(ev, "decode_running_max"), _num(ev, "decode_batch_limit"), _num(ev, "kv_usage_max")
    if decode_at_limit(ev) and _num(ev, "decode_busy_slots_mean") is None:
        return f"running {run_max:.0f} of a {limit:.0f} batch limit"
    if kv is not None and kv >= 0.98:
        return f"KV cache usage {kv:.0%}"
    return None


def _prefill_supply(ev: dict[str, Any]) -> Hypothesis:
    pfor, pagainst, score = [], [], 0.2
    pshare, pmean = _num(ev, "prefill_waiting_nonzero_share"), _num(ev, "prefill_waiting_mean")
    dshare, dmean = _num(ev, "decode_waiting_nonzero_share"), _num(ev, "decode_waiting_mean")
    tail = _num(ev, "prefill_tail_batch_share")
    breqs = _num(ev, "prefill_batch_reqs_mean")
    if pshare is not None:
        if pshare >= 0.5:
            pfor.append(f"prefill queue non-empty in {pshare:.0%} of samples (mean {pmean or 0:.1f} waiting)")
            score += 0.4 * min(1.0, pshare / 0.8)
        else:
            pagainst.append(f"prefill queue non-empty in only {pshare:.0%} of samples")
            score -= 0.15
    full = decode_full(ev)
    if full:
        pagainst.append(f"decode is full ({full}): the prefill queue is back-pressure from decode")
        score -= 0.45
    if dmean is not None:
        if dmean <= 0.5 and (dshare is None or dshare < 0.2) and not full:
            pfor.append(f"decode waiting near zero (mean {dmean:.2f}): decode is starved, not saturated")
            score += 0.2
        else:
            pagainst.append(f"decode also has waiting requests (mean {dmean:.1f})")
            score -= 0.2
    if tail is not None and tail >= 0.2:
        pfor.append(f"{tail:.0%} of prefill batches are tail chunks using < 1/8 of the token budget")
        score += 0.1
    if breqs is not None and breqs <= 1.05 and (pshare or 0) >= 0.5:
        pfor.append(f"prefill batches carry {breqs:.2f} requests on average while requests wait")
        score += 0.05
    if _num(ev, "decode_busy_slots_mean") is not None and (pshare or 0) > 0:
        # llama.cpp: one queue (requests_deferred) in front of the slots; waiting means waiting for a slot
        pagainst.append("single-queue server: deferred requests wait for a free slot, not for prefill")
        score -= 0.2
    return Hypothesis(name="prefill_supply", likelihood=_clamp(score), evidence_for=pfor, evidence_against=pagainst)


def _client_supply(s: Summary | None, ev: dict[str, Any]) -> Hypothesis:
    pfor, pagainst, score = [], [], 0.1
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio < 0.7:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} is {ratio:.0%} of C={s.concurrency}")
            score += 0.35
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}")
            score -= 0.05
        if s.request_rate and math.isfinite(s.request_rate):
            if win.qps < 0.8 * s.request_rate and ratio < 0.7:
                pfor.append(f"QPS {win.qps:.2f} below r={s.request_rate:g} with free concurrency slots")
                score += 0.2
            elif win.qps >= 0.95 * s.request_rate:
                pfor.append(f"QPS {win.qps:.2f} ≈ r={s.request_rate:g}: the sender's rate may be the limit")
                score += 0.2
    pshare = _num(ev, "prefill_waiting_nonzero_share")
    if pshare is not None and pshare >= 0.5:
        pagainst.append("requests are queueing inside the server, so the client is not starving it")
        score -= 0.1
    return Hypothesis(name="client_supply", likelihood=_clamp(score), evidence_for=pfor, evidence_against=pagainst)


def _decode_capacity(ev: dict[str, Any]) -> Hypothesis:
    pfor, pagainst, score = [], [], 0.15
    run_max, limit = _num(ev, "decode_running_max"), _num(ev, "decode_batch_limit")
    dmean, kv = _num(ev, "decode_waiting_mean"), _num(ev, "kv_usage_max")
    at_limit = decode_at_limit(ev)
    if at_limit and dmean is not None and dmean > 0.5:
        pfor.append(f"decode running at its batch limit ({run_max:.0f}/{limit:.0f}) with {dmean:.1f} waiting")
        score += 0.55
    elif run_max is not None and limit:
        pagainst.append(f"decode running peaks at {run_max:.0f} of a {limit:.0f} batch limit")
        score -= 0.05
    busy = _num(ev, "decode_busy_slots_mean")  # llama.cpp: slots in each decode step, read like D running
    if busy is not None and limit:
        if busy >= 0.9 * limit and dmean is not None and dmean > 0.5:
            pfor.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step with {dmean:.1f} deferred")
            score += 0.1
        else:
            pagainst.append(f"{busy:.1f} of {limit:.0f} slots busy per decode step")
    if kv is not None:
        if kv >= 0.95:
            pfor.append(f"KV cache usage reached {kv:.0%}")
            score += 0.3
        else:
            pagainst.append(f"KV cache usage peaked at {kv:.0%}")
    if dmean is not None and dmean <= 0.5:
        pagainst.append(f"decode waiting near zero (mean {dmean:.2f})")
        score -= 0.1
    return Hypothesis(name="decode_capacity", likelihood=_clamp(score), evidence_for=pfor, evidence_against=pagainst)


def _spec_acceptance(ev: dict[str, Any], knobs: dict[str, Any]) -> Hypothesis:
    al = _num(ev, "spec_accept_length")
    k = int(knobs.get("num_speculative_tokens") or 0)
    if al is None or k <= 0:
        return Hypothesis(name="spec_acceptance", likelihood=0.1,
                          evidence_against=["no speculative decoding in use: acceptance length not observed"])
    # AL = 1 + accepted/drafts; the ceiling is k + 1. Under ~half the extra tokens accepted is "low".
    frac = (al - 1.0) / k
    if frac < 0.5:
        return Hypothesis(name="spec_acceptance", likelihood=_clamp(0.5 + (0.5 - frac)),
                          evidence_for=[f"acceptance length {al:.2f} of a possible {k + 1}: drafts mostly wasted"])
    return Hypothesis(name="spec_acceptance", likelihood=0.15,
                      evidence_against=[f"acceptance length {al:.2f} of a possible {k + 1}"])


def imbalance_share(breakdown: dict[str, Any] | None) -> float | None:
    """Share of device time the breakdown attributes to expert imbalance (keys containing 'imbalance')."""
    if not breakdown:
        return None
    flat: dict[str, float] = {}

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(d, (int, float)) and not isinstance(d, bool):
            flat[prefix] = float(d)

    walk("", breakdown)
    shares = [v for k, v in flat.items() if "imbalance" in k and ("share" in k or "frac" in k)]
    if shares:
        return max(shares)
    imb = sum(v for k, v in flat.items() if "imbalance" in k)
    total = sum(v for k, v in flat.items() if "imbalance" not in k and "share" not in k and "frac" not in k)
    return imb / total if imb and total > 0 else (0.0 if total > 0 else None)


def _expert_imbalance(ev: dict[str, Any]) -> Hypothesis:
    share = imbalance_share(ev.get("breakdown"))
    if share is None:
        return Hypothesis(name="expert_imbalance", likelihood=0.1, evidence_against=["no time breakdown available"])
    if share >= 0.1:
        return Hypothesis(name="expert_imbalance", likelihood=_clamp(0.4 + 2 * share),
                          evidence_for=[f"breakdown: {share:.0%} of device time lost to expert imbalance"])
    return Hypothesis(name="expert_imbalance", likelihood=0.1,
                      evidence_against=[f"breakdown: only {share:.0%} of device time lost to expert imbalance"])


def _latency_bound(s: Summary | None, tpot_limit_ms: float | None) -> tuple[Hypothesis, float | None]:
    if s is None or tpot_limit_ms is None or s.tpot_ms.mean is None:
        return Hypothesis(name="latency_bound", likelihood=0.1, evidence_against=["no TPOT figure or no limit"]), None
    head = 1.0 - s.tpot_ms.mean / tpot_limit_ms
    if head < 0.1:
        return Hypothesis(name="latency_bound", likelihood=_clamp(0.7 + (0.1 - head) * 2),
                          evidence_for=[f"mean TPOT {s.tpot_ms.mean:.1f} ms leaves {head:.0%} headroom to {tpot_limit_ms:g} ms"]), head
    return Hypothesis(name="latency_bound", likelihood=_clamp(0.3 - head * 0.3),
                      evidence_against=[f"mean TPOT {s.tpot_ms.mean:.1f} ms leaves {head:.0%} headroom to {tpot_limit_ms:g} ms"]), head


def _load_headroom(s: Summary | None, ev: dict[str, Any], headroom: float | None,
                   ruled_out: frozenset[str] = frozenset()) -> Hypothesis:
    """The offered load, not the server, caps the decode batch: latency headroom left, the server absorbs
    every request the client allows, decode runs below its batch limit, and no queue forms inside."""
    pfor, pagainst, score = [], [], 0.1
    if headroom is None:
        return Hypothesis(name="load_headroom", likelihood=0.1, evidence_against=["no TPOT figure or no limit"])
    if headroom >= LOAD_HEADROOM:
        pfor.append(f"mean TPOT leaves {headroom:.0%} headroom: a bigger decode batch still meets the limit")
        score += 0.2 + 0.4 * min(1.0, (headroom - LOAD_HEADROOM) / 0.3)
    else:
        pagainst.append(f"mean TPOT leaves only {headroom:.0%} headroom")
        score -= 0.1
    pshare = _num(ev, "prefill_waiting_nonzero_share")
    queued = pshare is not None and pshare >= 0.5 and "prefill_supply" not in ruled_out and not decode_full(ev)
    if queued:
        pagainst.append(f"prefill queue non-empty in {pshare:.0%} of samples: more load would queue before prefill")
        score -= 0.6
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency and not queued:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio >= 0.85:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: C caps what is in flight")
            score += 0.15
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} is only {ratio:.0%} of "
                            f"C={s.concurrency}: C is not what caps the load")
            score -= 0.4
    run_max, limit = _num(ev, "decode_running_max"), _num(ev, "decode_batch_limit")
    dmean = _num(ev, "decode_waiting_mean")
    if run_max is not None and limit:
        if run_max >= 0.95 * limit and dmean is not None and dmean > 0.5 and "decode_capacity" in ruled_out:
            pfor.append("decode waits at its batch limit, but raising the limit here changed nothing")
        elif run_max >= 0.95 * limit and dmean is not None and dmean > 0.5:
            pagainst.append(f"decode already at its batch limit ({run_max:.0f}/{limit:.0f}) with requests waiting")
            score -= 0.6
        elif run_max < 0.95 * limit:
            pfor.append(f"decode batch peaks at {run_max:.0f} of a {limit:.0f} limit: room to batch more")
            score += 0.1
    return Hypothesis(name="load_headroom", likelihood=_clamp(score), evidence_for=pfor, evidence_against=pagainst)


BUDGET_FULL = 0.95  # prefill batches using this share of the token budget on average: the budget binds
CAP_FULL = 0.95  # carrying this share of the request cap on average (with budget to spare): the cap binds


def prefill_limit(ev: dict[str, Any], knobs: dict[str, Any]) -> tuple[str | None, str | None, float | None]:
    """Which per-batch limit fills the prefill batches (the token budget, the request cap, or neither: None), why,
    and the share of the budget the batches use on average (None without batch records or a budget)."""
    budget = knobs.get("max_num_batched_tokens") or knobs.get("chunked_prefill_size")
    cap = knobs.get("max_prefill_reqs")
    reqs, toks = _num(ev, "prefill_batch_reqs_mean"), _num(ev, "prefill_batch_tokens_mean")
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


def client_limit(s: Summary | None) -> tuple[str | None, str | None]:
    """Which of the sender's two limits holds the offered load down: the arrival rate or the concurrency cap."""
    win = (s.native or s.whole) if s else None
    if s is None or win is None or not s.concurrency or win.achieved_concurrency is None:
        return None, None
    ratio = win.achieved_concurrency / s.concurrency
    if ratio >= 0.9:
        return "concurrency", (f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: a higher "
                               f"arrival rate only queues at the sender")
    r = s.request_rate
    if r and math.isfinite(r) and win.qps >= 0.9 * r and ratio < 0.7:
        return "request_rate", (f"QPS {win.qps:.2f} ≈ r={r:g} with {ratio:.0%} of C={s.concurrency} in flight: "
                                f"a higher C adds nothing while the rate binds")
    return None, None


def decode_demand(ev: dict[str, Any]) -> float | None:
    """Running + waiting requests per decode instance, when decode runs at its batch limit with a queue."""
    run_mean, waiting = _num(ev, "decode_running_mean"), _num(ev, "decode_waiting_mean")
    if not decode_at_limit(ev) or run_mean is None or waiting is None or waiting <= 0.5:
        return None
    if _num(ev, "decode_busy_slots_mean") is not None:
        return None  # llama.cpp: one queue in front of the slots; deferred requests are not decode demand alone
    inst = _num(ev, "decode_instances") or 1.0
    return run_mean + waiting / max(inst, 1.0)


def diagnose(summary: Summary | None, evidence: dict[str, Any], tpot_limit_ms: float | None,
             knobs: dict[str, Any] | None = None, ruled_out: frozenset[str] | set[str] = frozenset()) -> Diagnosis:
    """Rank the named explanations of where throughput is lost, from queue and batch evidence; `ruled_out`
    names hypotheses a move from this station already tested negative: the queue they explain no longer
    argues against the load as the limit (what a negative rules out)."""
    ev = evidence or {}
    ruled = frozenset(ruled_out) - {"latency_bound"}
    latency, headroom = _latency_bound(summary, tpot_limit_ms)
    hyps = [_prefill_supply(ev), _client_supply(summary, ev), _decode_capacity(ev),
            _spec_acceptance(ev, knobs or {}), _expert_imbalance(ev), latency,
            _load_headroom(summary, ev, headroom, ruled)]
    # where the server loses throughput (profiles separate these); latency and load headroom are about the load
    throughput = [h for h in hyps if h.name not in ("latency_bound", "load_headroom")]
    ranked = sorted(throughput, key=lambda h: -h.likelihood)
    profile, why = False, None
    queues_seen = any(_num(ev, k) is not None for k in ("prefill_waiting_mean", "decode_waiting_mean"))
    if ranked[0].likelihood < SUPPORTED and ranked[0].likelihood >= OPEN_LOW:
        profile, why = True, f"no explanation is supported by the queues; {ranked[0].name} is only open"
    elif ranked[0].likelihood >= SUPPORTED and ranked[1].likelihood >= ranked[0].likelihood - SEPARATION:
        profile, why = True, f"queues cannot separate {ranked[0].name} from {ranked[1].name}"
    elif not queues_seen and ranked[0].likelihood < SUPPORTED:
        profile, why = True, "no queue evidence was collected"
    limit, limit_why, fill = prefill_limit(ev, knobs or {})
    client, client_why = client_limit(summary)
    return Diagnosis(hypotheses=hyps, propose_profile=profile, profile_reason=why, tpot_headroom=headroom,
                     prefill_limit=limit, prefill_limit_why=limit_why, prefill_budget_fill=fill, client_limit=client,
                     client_limit_why=client_why, decode_demand=decode_demand(ev))
