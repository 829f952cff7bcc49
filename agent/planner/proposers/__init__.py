"""The proposers, registered in ONE list: the deterministic planner asks them by phase (see base.py; `of_phase`
reads this list at each ask) and ranks what they return by the same value per card-hour and the same checks. A new
proposer is one module in this package and one line below."""
from __future__ import annotations

from agent.planner.proposers.base import (PHASES, RULES_LED, Asking, Exploring, Forecast, Phase, Proposals, Proposed,
                                          Proposer)
from agent.planner.proposers.coupled import CoupledPairs
from agent.planner.proposers.explorer import Explorer
from agent.planner.proposers.recoveries import LatencyRecovery, WindowRecovery
from agent.planner.proposers.rule_moves import RuleMoves
from agent.planner.proposers.twin_search import TwinSearch

PROPOSERS: tuple[Proposer, ...] = (
    WindowRecovery(),  # recover: the native window a confirmed load gain lost
    LatencyRecovery(),  # recover: a load gain that broke only decode-side latency limits, kept by a decode batch cap
    TwinSearch(),  # rank: the goal's twin (a simulator calibrated to its runs) searched; leads while it predicts well
    CoupledPairs(),  # rank: two levers the evidence says hold each other back, moved together
    RuleMoves(),  # rank: the evidence rules' one-change moves (agent/planner/rules/)
    Explorer(),  # explore: a model of this deployment's runs, when the rules run out
)


def of_phase(phase: Phase) -> tuple[Proposer, ...]:
    """The registered proposers of one phase, in registry order, read from the registry when asked."""
    return tuple(p for p in PROPOSERS if p.phase == phase)


RECOVER, RANK, EXPLORE = of_phase("recover"), of_phase("rank"), of_phase("explore")  # as registered (the planner asks of_phase)
__all__ = ["Asking", "EXPLORE", "Exploring", "Forecast", "PHASES", "PROPOSERS", "Phase", "Proposals", "Proposed", "Proposer", "RANK",
           "RECOVER", "RULES_LED", "of_phase"]
