"""Rank straggler: one DP / EP rank of an instance steps slower, or queues more, than its group's median. The ranks
of an instance meet at every step (an EP group's all-to-all; DP ranks step in lockstep), so the slowest rank gates
them all, while the instance's figures summed over its ranks look even. Read from each instance's ranks
(executor/evidence_ranks.py: the per-rank step time and queue, combined per figure); an engine that labels no
rank gives no evidence, and the hypothesis stays weak. No move of its own: the cause is the rank's (its experts'
load, its card, its share of the requests), and the expert-layout and routing moves are their rules' to weigh."""
from __future__ import annotations

from agent.planner.rules.base import WEAK, Ctx, Hypothesis, Rule, clamp

STEP_FAR = 1.5  # a judgement: a rank stepping 1.5x its group's median makes every rank of it lose a third of a step
QUEUE_FAR = 2.0  # a judgement: a rank holding twice its group's median queue (the median of a group of ranks)
QUEUE_MIN = 1.0  # a judgement: and at least one request more than the median (a queue of 1 against 0 is noise)
LIK_STEP = 0.7  # a judgement: a step time far from the group's is the direct sign (supported)
LIK_QUEUE = 0.45  # a judgement: a queue far from the group's alone is open (the router's choice may explain it)
W_BOTH = 0.15  # a scorer weight (judgement): the slow rank also holds the longest queue


def score(ctx: Ctx) -> Hypothesis:
    groups = ctx.ev.ranks or {}
    if not groups:
        return Hypothesis(name="rank_straggler", likelihood=WEAK,
                          evidence_against=["no per-rank figures (the engine labels no DP / EP rank)"])
    steps, queues = [], []
    for inst, g in sorted(groups.items()):
        step, queue = g.combined.get("step_s"), g.combined.get("waiting_mean")
        if step is not None and step.median > 0 and step.max >= STEP_FAR * step.median:
            steps.append(f"{inst}: rank {step.worst} steps in {step.max * 1000:.1f} ms, {step.max / step.median:.1f}x "
                         f"the median of its {step.ranks} ranks ({step.median * 1000:.1f} ms)")
        if queue is not None and queue.max - queue.median >= QUEUE_MIN and queue.max >= QUEUE_FAR * queue.median:
            queues.append(f"{inst}: rank {queue.worst} holds {queue.max:.1f} waiting, against a median of "
                          f"{queue.median:.1f} over its {queue.ranks} ranks")
    if not steps and not queues:
        return Hypothesis(name="rank_straggler", likelihood=WEAK,
                          evidence_against=[f"no rank far from its group's median ({len(groups)} instance(s) of "
                                            "several ranks)"])
    s = (LIK_STEP + (W_BOTH if queues else 0.0)) if steps else LIK_QUEUE
    return Hypothesis(name="rank_straggler", likelihood=clamp(s), evidence_for=steps + queues)


RULE = Rule(
    name="rank_straggler",
    prompt="rank_straggler: one DP/EP rank of an instance steps slower or queues more than its group's median; the "
           "slowest rank gates every step of its group (its experts' load, its card, its share of requests).",
    score=score, separable=False)
