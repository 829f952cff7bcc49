"""Errors raised by the state layer.

    StateError                      anything the state layer refuses
     ├── NotFound                   no such goal / run / candidate / station
     ├── Conflict                   a concurrent writer won (second approval of one card, duplicate id)
     │    └── Stale                 the card changed since it was shown (approval bound to an old hash)
     ├── InvalidTransition          a status change the lifecycle does not allow (e.g. done -> running)
     ├── StaleEpoch                 a fenced write carried an epoch that is not the lease's current one
     ├── NotValid                   only a `valid` result may become a negative (faults never do)
     └── GoalError (ValueError)     a goal spec was refused; `.errors` lists (field, reason)
"""
from __future__ import annotations


class StateError(Exception):
    """Base of every error the state layer raises on purpose."""


class NotFound(StateError, LookupError):
    pass


class Conflict(StateError):
    pass


class Stale(Conflict):
    pass


class InvalidTransition(StateError):
    def __init__(self, entity: str, old: str, new: str, allowed: tuple[str, ...] | list[str] = ()):
        super().__init__(f"{entity}: {old} -> {new} is not allowed (allowed from {old}: {sorted(allowed) or 'none'})")
        self.entity, self.old, self.new = entity, old, new


class StaleEpoch(StateError):
    def __init__(self, target: str, epoch: int, current: int):
        super().__init__(f"target {target!r}: epoch {epoch} refused, the lease's current epoch is {current}")
        self.target, self.epoch, self.current = target, epoch, current


class NotValid(StateError):
    pass


class GoalError(StateError, ValueError):
    """A goal spec was refused. The message lists every field with its reason."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        lines = "\n".join(f"  {field}: {reason}" for field, reason in errors)
        super().__init__(f"invalid goal spec {source}:\n{lines}")
        self.source = source
        self.errors = errors
