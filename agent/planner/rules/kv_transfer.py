"""KV-transfer bound: in a disaggregated deployment the P->D KV transfer, not compute, takes the time; more
prefill supply or more requests in flight only queue at the link, the P/D split is the lever.

Two pieces of evidence say so. The decode side's hand-over queue (`decode_deferred_mean`: requests whose KV is
still on its way, summed over the decode instances, as vLLM's waiting reason "deferred" and SGLang's decode
transfer queue count them) holding most of the requests the decode side has, while decode runs far below its
batch limit: the requests are in flight, but on the link. And a large communication share in the breakdown.
While the transfer binds, each decode instance receives KV at its link's rate, so one more decode instance
adds about 1/D of the rate; the prefill instances wait on the link (their idle share is the cards a smaller
prefill side frees).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import SUPPORTED, WEAK, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, role_terms
from core.evidence import Evidence
from core.knobs import (
    ARRIVAL_RATE, CLIENT_CAP, DECODE_INSTANCES, PREFILL_INSTANCES, PREFILL_REQUEST_CAP, PREFILL_TOKEN_BUDGET,
    role_of,
)

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

BOUND = 0.3  # communication share of a role's device time that makes the transfer the limit
WAIT_BOUND = 0.5  # share of the decode side's requests waiting for their KV that makes the transfer the limit
DAMP = 0.5  # a prefill-supply move while the transfer binds keeps this share of its confidence
LOAD_DAMP = 0.25  # more in flight while the transfer binds only lengthens the queue at the link
# the roles of the prefill-supply knobs (request cap, token budget, instances) and of the offered load (C, r)
PREFILL_KNOBS = frozenset({PREFILL_REQUEST_CAP, PREFILL_TOKEN_BUDGET, PREFILL_INSTANCES})
LOAD_KNOBS = frozenset({CLIENT_CAP, ARRIVAL_RATE})
PREFILL_FULL = 1.0  # the prefill side busy all the time: past that it, not the links, binds
BOUND_BASE = 0.3  # a transfer-bound reading's likelihood before its share adds (= OPEN_LOW): SUPPORTED at either bound
WAIT_WEIGHT = 0.6  # likelihood per unit of hand-over share: SUPPORTED at WAIT_BOUND, 0.9 with all of them on the link
GAIN_PREFILL_DOWN = 0.05  # the move's prior gain (a judgement): the same rate from fewer cards; value() sizes it


def _spare(diag: Diagnosis) -> float | None:
    """How many times the present rate the prefill side could supply (busy share up to PREFILL_FULL)."""
    busy = diag.prefill_busy
    return PREFILL_FULL / busy if busy else None


def transfer_wait(ev: Evidence) -> tuple[float, str] | None:
    """Share of the decode side's requests (running, waiting, waiting for KV) whose KV is still on the link,
    in words; None without a hand-over queue figure."""
    deferred = ev.decode_deferred_mean
    if deferred is None:
        return None
    running = ev.decode_running_total_mean
    if running is None:
        running = (ev.decode_running_mean or 0.0) * (ev.decode_instances or 1.0)
    total = deferred + running + (ev.decode_waiting_mean or 0.0)
    if total <= 0:
        return None
    share = deferred / total
    return share, (f"{deferred:.1f} request(s) wait for their KV transfer against {running:.1f} running in decode "
                   f"({share:.0%} of the decode side's requests are on the link)")


def score(ctx: Ctx) -> Hypothesis:
    pfor, pagainst, lik = [], [], WEAK
    terms = role_terms(ctx.ev, "communication_s")
    if terms:
        role, share = max(terms.items(), key=lambda kv: kv[1])
        line = f"breakdown: {share:.0%} of {role} device time is communication"
        if share >= BOUND:
            pfor.append(line)
            lik = max(lik, clamp(BOUND_BASE + share))
        else:
            pagainst.append(line)
    wait = transfer_wait(ctx.ev)
    if wait is not None:
        share, line = wait
        if share >= WAIT_BOUND:
            pfor.append(line)
            lik = max(lik, clamp(BOUND_BASE + WAIT_WEIGHT * share))
        else:
            pagainst.append(line)
    if not pfor and not pagainst:
        pagainst.append("no communication time or KV hand-over queue observed")
    return Hypothesis(name="kv_transfer", likelihood=lik, evidence_for=pfor, evidence_against=pagainst)


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    lik = diag.likelihood("kv_transfer")
    if lik < SUPPORTED:
        return None
    role = role_of(change.knob)
    if up and role in PREFILL_KNOBS:
        return Adjusted(conf * DAMP, gain, f" × {DAMP} (the KV transfer binds: more prefill queues at the link)")
    if up and role in LOAD_KNOBS and diag.transfer_wait is not None and diag.transfer_wait >= WAIT_BOUND:
        return Adjusted(conf * LOAD_DAMP, gain, f" × {LOAD_DAMP} ({diag.transfer_wait:.0%} of the decode side's "
                                                 f"requests wait for their KV: more in flight queues at the link)",
                        answered=True)
    old, new = change.old, change.new
    if role == DECODE_INSTANCES and up and isinstance(old, (int, float)) and old > 0 \
            and isinstance(new, (int, float)):
        more, spare = (new - old) / old, _spare(diag)  # each decode instance receives at its link's rate
        capped = more if spare is None else min(more, spare - 1.0)  # until the prefill side binds
        if capped <= 0:
            return None
        return Adjusted(max(conf, lik), max(gain, capped), f" (the KV transfer binds, {lik:.2f}: {new:g} decode "
                                                           f"instances receive {capped:+.0%} more KV"
                                                           + (", as far as prefill keeps up" if capped < more else "")
                                                           + ")")
    if role == PREFILL_INSTANCES and not up and isinstance(old, (int, float)) and old > 1 \
            and isinstance(new, (int, float)) and diag.prefill_busy is not None:
        freed = (old - new) / old  # the prefill side's cards, while it waits on the link
        idle = 1.0 - diag.prefill_busy
        if idle * old >= old - new:  # the idle prefill time covers the instances removed
            return Adjusted(max(conf, lik * idle), max(gain, freed * idle),
                            f" (the KV transfer binds and prefill is {idle:.0%} idle: {new:g} prefill instances "
                            f"keep up and free {freed:.0%} of its cards)")
    return None


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """While the transfer binds: the decode side grown to what the prefill side can feed. The rate scales with
    the decode links, so prefill's busy share scales with it; the jump is the largest listed decode instance
    count whose prefill stays within PREFILL_FULL busy, when that is beyond the next step."""
    if role_of(knob) != DECODE_INSTANCES or diag is None or not isinstance(cur, (int, float)) or cur <= 0 \
            or diag.likelihood("kv_transfer") < SUPPORTED or diag.transfer_wait is None \
            or diag.transfer_wait < WAIT_BOUND:
        return None
    spare = _spare(diag)
    ups = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cur)
    if spare is None or len(ups) < 2:
        return None
    target = max((v for v in ups if v <= cur * spare), default=None)
    if target is None or target == ups[0]:
        return None
    return "up", target, (f"{diag.transfer_wait:.0%} of the decode side's requests wait for their KV and prefill is "
                          f"{diag.prefill_busy:.0%} busy: {target:g} decode links receive what prefill can send "
                          f"(up to {spare:.1f}x the rate); higher output tok/s per card")


RULE = Rule(
    name="kv_transfer",
    prompt=("kv_transfer: most decode-side requests waiting for their KV (the hand-over queue) or a large "
            "communication share means the P->D KV transfer binds: more prefill supply or more in flight only "
            "queue at the link; shift the P/D split to the links (more decode instances, fewer idle prefill)."),
    score=score, value=value, sized=sized,
    moves={
        (PREFILL_INSTANCES, "down"): MoveRule(
            hypotheses=("kv_transfer",), gain=GAIN_PREFILL_DOWN,
            mechanism="fewer prefill instances while their KV waits at the link: the same rate from fewer cards",
            decision="whether the prefill side is larger than the KV links can drain",
            expected="about the same throughput from fewer cards (higher per card) if prefill idles on the link",
            rules_out="a prefill side larger than the links need"),
    })
