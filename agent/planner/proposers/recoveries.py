"""Recoveries (agent/planner/recovery.py): a confirmed gain the goal cannot take as it is, kept before anything new
is tried: the native window a load gain lost, and a load gain that broke only decode-side latency limits (mean
TPOT, a TPOT tail), kept by capping the decode batch."""
from __future__ import annotations

from agent.planner.proposers.base import Asking, Proposals, Proposed, Proposer
from agent.planner.recovery import latency_recovery, window_recovery


class WindowRecovery(Proposer):
    name = "window_recovery"
    phase = "recover"

    def propose(self, asking: Asking) -> Proposals:
        card = window_recovery(asking.history)
        return Proposals(moves=[Proposed(card, why="recover the objective's window of a confirmed gain")]
                         if card is not None else [])


class LatencyRecovery(Proposer):
    name = "latency_recovery"
    phase = "recover"

    def propose(self, asking: Asking) -> Proposals:
        card = latency_recovery(asking.history)
        return Proposals(moves=[Proposed(card, why="keep a load gain inside the decode-side limit by capping the decode "
                                                   "batch")] if card is not None else [])
