"""The planner's rules, one module per hypothesis (scorer over the evidence digest, moves, value model, prompt
line), registered in ONE list: the diagnosis scores them in this order, the move table and the LLM system
prompt are built from it. A new hypothesis is a new module added here."""
from __future__ import annotations

from agent.planner.rules import (
    client_supply, decode_capacity, expert_imbalance, kv_capacity, kv_transfer, latency_bound, load_headroom,
    prefill_supply, rank_straggler, spec_acceptance,
)
from agent.planner.rules.base import MoveRule, Rule
from core.knobs import ROLES

RULES: tuple[Rule, ...] = (
    prefill_supply.RULE, client_supply.RULE, decode_capacity.RULE, spec_acceptance.RULE, expert_imbalance.RULE,
    latency_bound.RULE, load_headroom.RULE, kv_transfer.RULE, kv_capacity.RULE, rank_straggler.RULE,
)
NAMES: tuple[str, ...] = tuple(r.name for r in RULES)


def _moves() -> dict[tuple[str, str], MoveRule]:
    out: dict[tuple[str, str], MoveRule] = {}
    for r in RULES:
        for key, move in r.moves.items():
            if key[0] not in ROLES or key[1] not in ("up", "down"):
                raise RuntimeError(f"move {key} of rule {r.name}: the table is keyed by (knob role, up | down)")
            if key in out:
                raise RuntimeError(f"move {key} is claimed by two rules (one owner per move)")
            out[key] = move
    return out


MOVES: dict[tuple[str, str], MoveRule] = _moves()  # (knob role, direction) -> the move


def prompt_lines() -> str:
    """The hypotheses part of the LLM system prompt: one line per registered rule."""
    return "\n".join(f"  - {r.prompt}" for r in RULES)
