"""The explorer (agent/planner/explorer.py): when the rules run out, a model of this deployment's own runs (TPE's
suggestions, valued by expected improvement per card-hour) proposes the next station."""
from __future__ import annotations

from agent.planner import explorer
from agent.planner.proposers.base import Asking, Proposals, Proposed, Proposer


class Explorer(Proposer):
    name = "explorer"
    phase = "explore"

    def propose(self, asking: Asking) -> Proposals:
        props, told = explorer.propose(asking.history, asking.why_rules, asking.restage)
        return Proposals(moves=[Proposed(p.card, p.value, p.prediction) for p in props], told=told)
