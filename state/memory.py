"""Negatives memory: a negative applies only under the conditions it was observed in.

Pure matching over stored negatives: the same scenario, parent station, source identity and data
version means "do not repeat"; any difference means "may retry, and say which condition changed".
"""
from __future__ import annotations

from state.snapshots import Conditions, Negative, NegativeMatch

CONDITION_FIELDS = ("scenario", "parent_hash", "source_identity", "data_version")


def differences(a: Conditions, b: Conditions) -> tuple[str, ...]:
    """Names of the conditions that differ, in a fixed order."""
    return tuple(f for f in CONDITION_FIELDS if getattr(a, f) != getattr(b, f))


def match_negative(found: list[Negative], conditions: Conditions) -> NegativeMatch:
    """`same` if any stored negative has exactly these conditions; else `changed` naming what differs
    from the closest one; `none` if the knob/value was never negative."""
    if not found:
        return NegativeMatch(status="none")
    ranked = sorted(found, key=lambda n: (len(differences(n.conditions, conditions)), -n.id))
    best = ranked[0]
    diff = differences(best.conditions, conditions)
    return NegativeMatch(status="changed" if diff else "same", negative=best, changed=diff)
