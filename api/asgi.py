"""The shape of this app's plain ASGI middleware (no per-request task, unlike Starlette's BaseHTTPMiddleware): HTTP
requests go to `http`, everything else (lifespan) passes through untouched."""
from __future__ import annotations

from typing import Any


class HttpMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise NotImplementedError
