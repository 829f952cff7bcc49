"""The request guard, outermost on the app: size limit first, then authentication, then the body.

1. A declared `Content-Length` beyond `settings.max_body_bytes` gets 413 before a byte of the body is read.
2. An operation of the permission table (api/permissions.py) needs a known bearer token with the route's
   role: 401 / 403 come from the headers alone, so an unauthenticated client never makes the server read,
   buffer or parse its body.
3. The body is then read up to the limit (a chunked body that goes beyond it gets 413 the moment it does);
   a JSON body nested deeper than core/bounded.py allows gets 422 naming the limit before any parser recurses
   into it, and one that repeats a key (at any depth) 422 naming the key and its line; the rest is handed to
   the app.
uvicorn reads a body only as fast as the app asks for it (its flow control pauses the socket), so a refused
100 MB upload costs the server a few socket buffers, not 100 MB.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from starlette.responses import JSONResponse

from api import permissions
from api.settings import ROLE_RANK
from core.bounded import BoundsError, load_json

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RequestGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        svc = getattr(scope["app"].state, "service", None)
        limit = svc.settings.max_body_bytes if svc is not None else 1 << 20
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        declared = headers.get("content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > limit):
            await _refuse(scope, receive, send, 413, f"request body larger than {limit} bytes (max_body_bytes)",
                          close=True)
            return
        pending = declared not in (None, "0") or "transfer-encoding" in headers  # a body the client may still send
        hit = permissions.match(scope["method"], scope["path"])
        if hit is not None and svc is not None:
            need = permissions.route_role(*hit)
            scheme, _, token = headers.get("authorization", "").partition(" ")
            who = svc.tokens.lookup(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
            if who is None:
                why = ("authentication required: send 'Authorization: Bearer <token>'" if not token.strip()
                       else "unknown or revoked token")
                await _refuse(scope, receive, send, 401, why, {"WWW-Authenticate": "Bearer"}, close=pending)
                return
            if need is not None and ROLE_RANK[who.role] < ROLE_RANK[need]:
                await _refuse(scope, receive, send, 403, f"{who.name} has role {who.role}; this needs {need}",
                              close=pending)
                return
        if scope["method"] in ("GET", "HEAD", "OPTIONS") and declared in (None, "0"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(scope, receive, send, 413, f"request body larger than {limit} bytes (max_body_bytes)",
                              close=True)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        kind = headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if body and (kind == "application/json" or kind.endswith("+json")):
            try:  # before any parser recurses into it (YAML goals are bounded where they are read); a key
                load_json(body)  # repeated at any depth is refused here for every JSON body, naming it and its line
            except BoundsError as e:
                await _refuse(scope, receive, send, 422, [{"loc": ["body"], "msg": f"request body {e}",
                                                          "type": "value_error"}])
                return
            except ValueError:
                pass  # not JSON at all: the route refuses it in its own words
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, code: int, detail: Any,
                  headers: dict[str, str] | None = None, close: bool = False) -> None:
    """Answer without reading the body; with a body still coming the connection closes (so uvicorn drops it
    unread instead of waiting for it)."""
    resp = JSONResponse({"detail": detail}, status_code=code,
                        headers={**(headers or {}), **({"Connection": "close"} if close else {})})
    await resp(scope, receive, send)
