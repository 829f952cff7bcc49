"""Prefix-cache flush of a warm service before a zero-cache run.

A reused service still holds the previous run's prompts; a zero-cache scenario run on it would hit
them and break its contract. Each engine has its own way to forget them; where none works the
caller restarts the service instead (a cold start has an empty cache by construction).
"""
from __future__ import annotations

import json
from typing import Any, Protocol

from executor.templates import ServiceSpec

# engine -> flush request. vLLM mounts /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1 (its
# template sets it); SGLang's radix cache: /flush_cache; llama.cpp: erase every slot's KV.
FLUSH_PATH = {"sim": "/reset_prefix_cache", "vllm": "/reset_prefix_cache", "vllm-ascend": "/reset_prefix_cache",
              "sglang": "/flush_cache"}


class HttpProbe(Protocol):
    async def http(self, svc: ServiceSpec, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, str]: ...


def cache_holders(services: tuple[ServiceSpec, ...]) -> list[ServiceSpec]:
    """Engine instances (a router holds no KV cache)."""
    return [s for s in services if s.role != "router"]


async def flush_service(probe: HttpProbe, svc: ServiceSpec, engine: str) -> dict[str, Any]:
    """One service's flush; `ok` False means the caller must restart it to get an empty cache."""
    if engine == "llamacpp":
        status, body = await probe.http(svc, "GET", "/slots")
        try:
            ids = [int(s["id"]) for s in json.loads(body)] if status == 200 else None
        except (ValueError, TypeError, KeyError):
            ids = None
        if ids is None:
            return {"service": svc.name, "method": "GET /slots", "status": status, "ok": False}
        codes = [(await probe.http(svc, "POST", f"/slots/{i}?action=erase"))[0] for i in ids]
        return {"service": svc.name, "method": "POST /slots/{id}?action=erase", "slots": len(ids),
                "status": codes, "ok": all(c == 200 for c in codes)}
    path = FLUSH_PATH.get(engine)
    if path is None:
        return {"service": svc.name, "method": None, "status": None, "ok": False}
    status, _ = await probe.http(svc, "POST", path)
    return {"service": svc.name, "method": f"POST {path}", "status": status,
            "ok": status is not None and 200 <= status < 300}
