"""Prefix-cache flush of a warm service before a zero-cache run.

A reused service still holds the previous run's prompts; a zero-cache scenario run on it would hit
them and break its contract. Each engine's adapter (executor/engines/) knows its own way to forget
them and what answer means forgotten; where none works the caller restarts the service instead (a
cold start has an empty cache by construction).
"""
from __future__ import annotations

from typing import Any, Protocol

from executor.engines import ADAPTERS
from executor.engines.base import ServiceSpec


class HttpProbe(Protocol):
    async def http(self, svc: ServiceSpec, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, str]: ...


def cache_holders(services: tuple[ServiceSpec, ...]) -> list[ServiceSpec]:
    """Engine instances (a router holds no KV cache); a follower process of a multi-host instance is flushed
    through its leader's API."""
    return [s for s in services if s.role != "router" and s.leader is None]


async def flush_service(probe: HttpProbe, svc: ServiceSpec, engine: str) -> dict[str, Any]:
    """One service's flush; `ok` False means the caller must restart it to get an empty cache."""
    a = ADAPTERS.get(engine)
    if a is None:
        return {"service": svc.name, "method": None, "status": None, "ok": False}
    return await a.flush(probe, svc)
