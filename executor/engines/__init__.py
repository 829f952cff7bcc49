"""Engine adapters, one module per engine; this registry maps a target's `engine` to its adapter.

Adding an engine is one module here (an Adapter subclass and its ADAPTER) plus its entry below and its tests.
"""
from __future__ import annotations

from executor.engines import llamacpp, mindie, sglang, sim, vllm, vllm_ascend
from executor.engines.base import Adapter
from core.errors import FieldError

ADAPTERS: dict[str, Adapter] = {m.ADAPTER.name: m.ADAPTER for m in (sim, vllm, vllm_ascend, sglang, mindie, llamacpp)}


def adapter(engine: str) -> Adapter:
    """The adapter of an engine (or template) name; unknown names are refused with the known ones."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise FieldError("engine", f"{engine!r} is not one of {sorted(ADAPTERS)}") from None


def metric_names(key: str) -> tuple[str, ...]:
    """Every adapter's metric names for one evidence key, in registry order (first present wins)."""
    out: list[str] = []
    for a in ADAPTERS.values():
        out += [n for n in a.metrics.get(key, ()) if n not in out]
    return tuple(out)
