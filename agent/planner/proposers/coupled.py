"""Coupled pairs (agent/planner/pairs.py): two levers the evidence names as holding each other back, moved
together; where the coupling is exclusive, either lever's one-change move is held back alone (the pair runs
first; each alone stays open)."""
from __future__ import annotations

from agent.planner.pairs import pair_moves
from agent.planner.proposers.base import Asking, Proposals, Proposed, Proposer


class CoupledPairs(Proposer):
    name = "coupled_pairs"
    phase = "rank"

    def propose(self, asking: Asking) -> Proposals:
        pairs, held = pair_moves(asking.history, asking.diag, asking.restart)
        return Proposals(moves=[Proposed(card, v) for card, v in pairs], holds=held)
