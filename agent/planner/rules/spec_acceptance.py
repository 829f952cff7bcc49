"""Spec acceptance: is one more draft position worth its draft cost? Read from the acceptance per draft position
(share of drafts whose position i+1 was accepted) and the draft share of decode time; without per-position
figures, the mean acceptance length says only whether drafts are mostly wasted."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import WEAK, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, role_terms
from core.knobs import DRAFT_WIDTH, by_role, role_of
from core.evidence import Evidence

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

DEFAULT_DRAFT_COST = 0.05  # one draft position's cost relative to a target-model decode step, when not measured
MODEL_CONFIDENCE = 0.6  # measured acceptance per position: the model of a width change is that sure
BATCH_MATCH = 0.15  # two runs price a position only when their decode batches are within this share of each other
DEPTH_DECAY = 0.8  # no ratio to extrapolate (one position measured): each further one accepted 0.8 as often (judgement)
WASTED_LIK = 0.6  # a last position that earns less than its cost: SUPPORTED's floor, plus the margin it loses by
DRAFT_PAYS = 0.15  # drafts in use and earning their cost: weak (a judgement), no case for a narrower draft
LOW_ACCEPTANCE = 0.5  # under half of the extra tokens a draft offers accepted: drafts mostly wasted
LOW_LIK = 0.5  # low acceptance without per-position figures: open (a judgement), plus the margin under LOW_ACCEPTANCE
MIN_WIDTHS = 3  # a jump needs three listed widths at least: the current one, the next one and one past it
GAIN_WIDER = 0.1  # the move's prior gain (a judgement): more tokens per step where acceptance stays high
GAIN_NARROWER = 0.1  # the move's prior gain (a judgement): fewer rejected drafts where acceptance is low


def positions(ev: Evidence) -> list[float] | None:
    p = ev.spec_accept_per_position
    if not isinstance(p, list) or not p or not all(isinstance(x, (int, float)) for x in p):
        return None
    return [max(0.0, min(1.0, float(x))) for x in p]


def draft_cost(ev: Evidence, k: int) -> float | None:
    """One draft position's time relative to the rest of a decode step, from the breakdown's draft_s."""
    share = role_terms(ev, "draft_s").get("decode")
    if share is None or k <= 0 or share >= 1.0:
        return None
    return share / (1.0 - share) / k


def fitted_cost(history: History, knobs: dict[str, Any]) -> tuple[float, str] | None:
    """One draft position's cost relative to a draft-free step, from the step time measured at two draft widths.

    The breakdown's draft share prices only the draft passes; each position also adds a token per sequence to the
    target model's verification pass, which no single run separates from the rest of its step. Two valid runs
    that differ only in the draft width (same decode batch within BATCH_MATCH) do: a step is TPOT x tokens per
    step (the acceptance length), and step(k) = S0 (1 + k c) gives c = (rho - 1) / (k1 - rho k2) for
    rho = step(k1) / step(k2). The pair whose batch is nearest the station's (decode_running_mean of its latest
    run) is used; None without such a pair or when the fit is not a positive cost."""
    ref = history.latest_valid(knobs)
    b0 = ref.evidence.decode_running_mean if ref is not None else None
    groups: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for o in history.outcomes:
        if o.verdict != "valid" or o.summary is None or not o.summary.tpot_ms.mean:
            continue
        ev = o.evidence
        k, al, b = int(by_role(o.card.knobs, DRAFT_WIDTH) or 0), ev.spec_accept_length, \
            ev.decode_running_mean
        if k <= 0 or not al or not b:
            continue
        rest = repr(sorted((n, repr(v)) for n, v in o.card.knobs.items() if role_of(n) != DRAFT_WIDTH))
        groups.setdefault(rest, {}).setdefault(k, []).append((float(o.summary.tpot_ms.mean) * al, b))
    best: tuple[float, float, str] | None = None  # (distance to the station's batch, c, words)
    for widths in groups.values():
        ks = sorted(widths)
        for i, k1 in enumerate(ks):
            for k2 in ks[i + 1:]:
                s1, n1 = (sum(x) / len(x) for x in zip(*widths[k1]))
                s2, n2 = (sum(x) / len(x) for x in zip(*widths[k2]))
                if abs(n1 - n2) > BATCH_MATCH * max(n1, n2):
                    continue
                rho = s1 / s2
                den = k1 - rho * k2
                c = (rho - 1.0) / den if den else -1.0
                if not (c > 0):
                    continue
                dist = abs((n1 + n2) / 2 - b0) if b0 else 0.0
                words = (f"fitted from the step time at k {k1} and {k2} ({s1:.1f} and {s2:.1f} ms per step at a decode "
                         f"batch of ~{(n1 + n2) / 2:.0f}): draft and verification together")
                if best is None or dist < best[0]:
                    best = (dist, c, words)
    return None if best is None else (best[1], best[2])


def predicted_gain(p: list[float], k_old: int, k_new: int, cost: float) -> float:
    """Relative decode throughput of k_new draft positions over k_old: tokens per step / step time. Positions past
    the measured ones are extrapolated geometrically from the last two (acceptance only falls with depth)."""
    acc = list(p)
    while len(acc) < max(k_old, k_new):
        last = acc[-1]
        ratio = min(1.0, last / acc[-2]) if len(acc) >= 2 and acc[-2] > 0 else DEPTH_DECAY
        acc.append(last * ratio)

    def rate(k: int) -> float:
        return (1.0 + sum(acc[:k])) / (1.0 + k * cost)

    return rate(k_new) / rate(k_old) - 1.0 if rate(k_old) > 0 else 0.0


def score(ctx: Ctx) -> Hypothesis:
    al = ctx.ev.spec_accept_length
    k = int(by_role(ctx.knobs, DRAFT_WIDTH) or 0)
    p = positions(ctx.ev)
    if p is not None and k > 0:
        cost = draft_cost(ctx.ev, k)
        c = DEFAULT_DRAFT_COST if cost is None else cost
        last = p[min(k, len(p)) - 1]
        line = (f"acceptance per position {[round(x, 2) for x in p[:k]]}: position {k} accepted in {last:.0%} of "
                f"drafts at a draft cost of {c:.2f} step per position" + (" (assumed)" if cost is None else ""))
        if last < c:  # the last position earns less than it costs: the draft is too wide
            return Hypothesis(name="spec_acceptance", likelihood=clamp(WASTED_LIK + (c - last)), evidence_for=[line])
        return Hypothesis(name="spec_acceptance", likelihood=DRAFT_PAYS, evidence_against=[line])
    if al is None or k <= 0:
        return Hypothesis(name="spec_acceptance", likelihood=WEAK,
                          evidence_against=["no speculative decoding in use: acceptance length not observed"])
    # AL = 1 + accepted/drafts; the ceiling is k + 1. Under ~half the extra tokens accepted is "low".
    frac = (al - 1.0) / k
    if frac < LOW_ACCEPTANCE:
        return Hypothesis(name="spec_acceptance", likelihood=clamp(LOW_LIK + (LOW_ACCEPTANCE - frac)),
                          evidence_for=[f"acceptance length {al:.2f} of a possible {k + 1}: drafts mostly wasted"])
    return Hypothesis(name="spec_acceptance", likelihood=DRAFT_PAYS,
                      evidence_against=[f"acceptance length {al:.2f} of a possible {k + 1}"])


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    """A draft-width change valued by the acceptance model: the predicted gain, or nothing when it loses."""
    if role_of(change.knob) != DRAFT_WIDTH or diag.spec_positions is None:
        return None
    try:
        k_old, k_new = int(change.old or 0), int(change.new or 0)
    except (TypeError, ValueError):
        return None
    if k_old <= 0 or k_new <= 0:
        return None  # switching drafting on or off is speculative_method's question
    cost = DEFAULT_DRAFT_COST if diag.draft_cost is None else diag.draft_cost
    g = predicted_gain(diag.spec_positions, k_old, k_new, cost)
    src = f", {diag.draft_cost_why}" if getattr(diag, "draft_cost_why", None) else ""
    note = (f" (acceptance model: k {k_old} -> {k_new} predicts {g:+.1%} decode throughput at {cost:.2f} "
            f"step/position{src})")
    if g <= 0:
        return Adjusted(conf, 0.0, note, answered=True)
    return Adjusted(max(conf, MODEL_CONFIDENCE), g, note)


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """The listed draft width the acceptance model rates best, when it lies beyond the next width that way: the
    model values every width at once, so a move need not walk there one position at a time. Only widths whose
    positions were measured (and the next one) are rated: acceptance past them is an extrapolation, so a wider
    draft is still walked to one position at a time."""
    if role_of(knob) != DRAFT_WIDTH or diag is None or diag.spec_positions is None:
        return None
    try:
        k0 = int(cur or 0)
    except (TypeError, ValueError):
        return None
    ks = sorted(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)
                and 0 < v <= len(diag.spec_positions) + 1)
    if k0 <= 0 or len(ks) < MIN_WIDTHS:
        return None
    cost = DEFAULT_DRAFT_COST if diag.draft_cost is None else diag.draft_cost
    gains = {k: predicted_gain(diag.spec_positions, k0, k, cost) for k in ks if k != k0}
    k1 = max(gains, key=lambda k: (gains[k], -abs(k - k0)), default=None)
    if k1 is None or gains[k1] <= 0:
        return None
    way = [k for k in ks if (k > k0) == (k1 > k0) and k != k0]
    nxt = min(way, key=lambda k: abs(k - k0))
    if k1 == nxt:
        return None
    return ("up" if k1 > k0 else "down"), k1, (f"the acceptance model rates k={k1} best of the listed widths "
                                               f"({gains[k1]:+.1%} over k={k0} at {cost:.2f} step/position)")


RULE = Rule(
    name="spec_acceptance",
    prompt=("spec_acceptance: from acceptance per draft position: one more position is worth it when its expected "
            "acceptance exceeds its draft cost (draft share of decode time per position); a last position accepted "
            "less often than it costs calls for a narrower draft."),
    score=score, value=value, sized=sized,
    moves={
        (DRAFT_WIDTH, "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=GAIN_WIDER,
            mechanism="a wider draft accepts more tokens per step when acceptance is high",
            decision="the draft width", expected="higher decode throughput if acceptance stays high",
            rules_out="a wider draft at this acceptance"),
        (DRAFT_WIDTH, "down"): MoveRule(
            hypotheses=("spec_acceptance",), gain=GAIN_NARROWER,
            mechanism="a narrower draft wastes fewer device cycles on rejected tokens",
            decision="the draft width", expected="gain only if acceptance length is low",
            rules_out="draft waste as the limit"),
    })
