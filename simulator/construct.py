"""Pydantic models built from trusted values at the cost of a dict: a batch run builds thousands of records.

`BaseModel.model_construct` walks every field of the class looking for aliases and defaults on each call, 3-5 µs a
model, a tenth of a simulated run's wall time (a record per request, a sample per instance per scraped second, a
prefill batch per step). `construct(cls, **values)` does exactly what model_construct does in its plain case (every
field given by name, in field order; no alias, private attribute, post-init hook or root model: checked once per
class) and hands every other case to model_construct itself.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


@lru_cache(maxsize=None)
def _plain(cls: type[BaseModel]) -> tuple[tuple[str, ...], bool] | None:
    """(the field names in order, whether extra fields are allowed) when model_construct's plain case applies."""
    if cls.__pydantic_root_model__ or cls.__pydantic_post_init__ or cls.__private_attributes__:
        return None
    for name, f in cls.__pydantic_fields__.items():
        if f.alias not in (None, name) or f.validation_alias is not None:
            return None
    return tuple(cls.__pydantic_fields__), cls.model_config.get("extra") == "allow"


def construct(cls: type[M], **values: Any) -> M:
    """cls.model_construct(**values), without its per-field walk when every field is given in field order."""
    plain = _plain(cls)
    if plain is None or tuple(values) != plain[0]:
        return cls.model_construct(**values)
    m = cls.__new__(cls)
    _set(m, "__dict__", values)
    _set(m, "__pydantic_fields_set__", set(plain[0]))
    _set(m, "__pydantic_extra__", {} if plain[1] else None)
    _set(m, "__pydantic_private__", None)
    return m
