"""Headers that keep a browser from turning a page of this service against its reader: every response says
`X-Content-Type-Options: nosniff`; every HTML page (the dashboard, the report, /docs, /redoc) also gets a
Content-Security-Policy and `X-Frame-Options: DENY`.

The policy loads nothing from elsewhere and runs only the page's own scripts: each inline `<script>` of the page is
allowed by its SHA-256 (computed from the body sent, so the dashboard, Swagger UI and ReDoc need no list kept by
hand), every other script only from this service. Images may be data: (the report's plots) or blob: (the dashboard
draws the frontier from a fetched PNG and opens the report from a blob); no page may be framed (clickjacking).
"""
from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from starlette.datastructures import MutableHeaders

from api.asgi import HttpMiddleware

_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script>", re.S | re.I)


def policy(page: bytes) -> str:
    """The Content-Security-Policy of one HTML page: its own inline scripts by hash, nothing from elsewhere."""
    hashes = sorted({"'sha256-" + base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode() + "'"
                     for m in _INLINE_SCRIPT.finditer(page)})
    return "; ".join(("default-src 'none'", "script-src 'self' " + " ".join(hashes) if hashes else "script-src 'self'",
                      "style-src 'self' 'unsafe-inline'", "img-src 'self' data: blob:", "font-src 'self' data:",
                      "connect-src 'self'", "worker-src 'self' blob:", "base-uri 'none'", "form-action 'self'",
                      "frame-ancestors 'none'"))


class PageHeaders(HttpMiddleware):
    """An HTML response is held until its body is complete (pages here are small and self-contained) so that its
    policy can name its inline scripts; any other response passes as it comes."""

    async def http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        held: dict[str, Any] | None = None
        body: list[bytes] = []

        async def sending(msg: dict[str, Any]) -> None:
            nonlocal held
            if msg["type"] == "http.response.start":
                headers = MutableHeaders(scope=msg)
                headers["X-Content-Type-Options"] = "nosniff"
                if headers.get("content-type", "").startswith("text/html"):
                    held = msg
                    return
            elif held is not None and msg["type"] == "http.response.body":
                body.append(msg.get("body", b""))
                if msg.get("more_body", False):
                    return
                page = b"".join(body)
                headers = MutableHeaders(scope=held)
                headers["Content-Security-Policy"] = policy(page)
                headers["X-Frame-Options"] = "DENY"
                await send(held)
                msg = {"type": "http.response.body", "body": page}
            await send(msg)

        await self.app(scope, receive, sending)
