"""Expert imbalance: is a relayout worth its cost? Read from the expert load per EP rank (max over mean) and the
breakdown's imbalance time; without either, a relayout is worth nothing."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import OPEN_LOW, WEAK, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, role_terms
from core.knobs import EXPERT_PLACEMENT, role_of
from core.evidence import Evidence

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis

MOE_SHARE = 0.5  # share of a step spent in expert layers, when only the load spread is known
RECOVERABLE = 0.8  # share of the skew loss a fitted static layout wins back (its own fit is imperfect)
SIGNIFICANT = 0.05  # recoverable share of device time that makes imbalance a candidate explanation
# without a load record, the breakdown's imbalance time also holds the per-step routing noise no layout removes
UNRECORDED_SKEW = 0.5  # so half of it is counted as layout skew (a judgement)
LIK_BASE = 0.45  # likelihood 0.45 + 2 × loss: open (0.55) at a SIGNIFICANT 5 % loss, supported from 7.5 %
LIK_PER_LOSS = 2  # likelihood per unit of recoverable loss: a 27.5 % loss reaches 1.0
GAIN_RELAYOUT = 0.15  # the move table's prior gain (a judgement): value() replaces it by the recoverable loss


def legacy_share(breakdown: dict[str, Any] | None) -> float | None:
    """A breakdown that states the imbalance as a share or fraction key (older captures)."""
    flat: dict[str, float] = {}

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(d, (int, float)) and not isinstance(d, bool):
            flat[prefix] = float(d)

    walk("", breakdown or {})
    shares = [v for k, v in flat.items() if "imbalance" in k and ("share" in k or "frac" in k)]
    return max(shares) if shares else None


def imbalance_loss(ev: Evidence) -> tuple[float | None, str | None]:
    """Share of device time a balanced layout would win back, and the evidence it is read from. The load spread
    (max over mean routed tokens per EP rank, summed over the run) is the layout's persistent skew: the most
    loaded rank sets every step, so expert-layer time shrinks by 1 - 1/spread when the skew is flattened; the
    expert-layer share of decode time is compute + imbalance in the breakdown. Without a load record, the
    breakdown's imbalance time (which also holds the per-step routing noise no layout removes) counts half."""
    spread = ev.expert_load_spread
    terms = {t: role_terms(ev, t).get("decode") for t in ("compute_s", "imbalance_s")}
    if spread is not None and spread >= 1.0:
        known = terms["compute_s"] is not None and terms["imbalance_s"] is not None
        moe = (terms["compute_s"] or 0.0) + (terms["imbalance_s"] or 0.0) if known else MOE_SHARE
        loss = moe * (1.0 - 1.0 / spread)
        return loss, (f"expert load per EP rank: the most loaded rank carries {spread:.2f}× the mean; expert layers "
                      f"take {moe:.0%} of decode time" + ("" if known else " (assumed)") +
                      f": ~{loss:.0%} of it is lost to the skew")
    if terms["imbalance_s"] is not None:
        share = terms["imbalance_s"]
        return share * UNRECORDED_SKEW, (f"breakdown: {share:.0%} of decode device time spent waiting on the most "
                                         f"loaded EP rank (no load record: half counted as layout skew)")
    legacy = legacy_share(ev.breakdown.root)
    if legacy is not None:
        return legacy, f"breakdown: {legacy:.0%} of device time lost to expert imbalance"
    return None, None


def score(ctx: Ctx) -> Hypothesis:
    loss, line = imbalance_loss(ctx.ev)
    if loss is None:
        return Hypothesis(name="expert_imbalance", likelihood=WEAK,
                          evidence_against=["no expert load or imbalance time observed"])
    if loss >= SIGNIFICANT:
        return Hypothesis(name="expert_imbalance", likelihood=clamp(LIK_BASE + LIK_PER_LOSS * loss),
                          evidence_for=[line])
    return Hypothesis(name="expert_imbalance", likelihood=WEAK,
                      evidence_against=[line + ": too little to pay a relayout"])


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    """A relayout gains what the imbalance loses (the recoverable share), and nothing without the evidence."""
    if role_of(change.knob) != EXPERT_PLACEMENT or not up:
        return None
    if diag.imbalance_loss is None:
        return Adjusted(conf, 0.0, " (no imbalance evidence: a relayout is worth nothing)", answered=True)
    if diag.likelihood("expert_imbalance") < OPEN_LOW:
        return Adjusted(conf, 0.0, f" (a {diag.imbalance_loss:.0%} imbalance loss does not pay a relayout)", answered=True)
    g = diag.imbalance_loss * RECOVERABLE
    return Adjusted(conf, g, f" (relayout wins back ~{g:.0%}: {RECOVERABLE:.0%} of a {diag.imbalance_loss:.0%} imbalance loss)")


RULE = Rule(
    name="expert_imbalance",
    prompt=("expert_imbalance: the most loaded EP rank sets the step time: a relayout (static expert layout) is "
            "worth its cost only when the load spread (max over mean) or the breakdown's imbalance time is large."),
    score=score, value=value,
    moves={
        (EXPERT_PLACEMENT, "up"): MoveRule(
            hypotheses=("expert_imbalance",), gain=GAIN_RELAYOUT,
            mechanism="a static EPLB layout evens expert load across ranks",
            decision="whether expert imbalance costs device time", expected="higher decode throughput if imbalance is large",
            rules_out="expert placement as the limit"),
    })
