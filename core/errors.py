"""The error a value refused for a named field raises, shared by every layer: the field travels as data, so the API's
422 names it (`loc`) and a goal's error list paths it without reading it back from the message's words."""
from __future__ import annotations


class FieldError(ValueError):
    """A value refused for `field` (a dotted path: `count`, `knobs.max_num_seqs`, `slos.ttft_ms`) with `reason`;
    its message is "field: reason"."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
