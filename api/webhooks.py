"""Outgoing notifications: approval needed, a decision made, the loop stopped.

Payload shapes: generic JSON, Slack-compatible (`text` + mrkdwn `blocks`), Feishu-compatible
(`msg_type: text`). Delivery runs on one background thread so the loop never waits on a chat
server; a failed POST is retried a bounded number of times (transport errors and 5xx only).

Signing (TUNELOOP_WEBHOOK_SECRET): every POST carries

    X-Tuneloop-Timestamp: <unix seconds>
    X-Tuneloop-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

over the exact body bytes sent; a receiver recomputes it (`verify`) and refuses a stale timestamp (replay).
Feishu custom bots check their own convention as well: `timestamp` and `sign` (base64 HMAC-SHA256 keyed
with "<timestamp>\n<secret>" over an empty message) in the body. Slack incoming webhooks have no signature
of their own (the URL is the secret); they get the headers, which Slack ignores.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import queue
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

import httpx
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from api.settings import Webhook
from core import escape
from core.errors import FieldError

log = logging.getLogger("tuneloop.webhooks")
EVENTS = ("approval_needed", "decision", "stopped")


class _Retryable(Exception):
    pass


def payload(fmt: str, event: str, goal_id: str, text: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body for one notification in the given format (pure). Slack reads `text` and the section as mrkdwn: both
    escaped as the chat-app cards are (core/escape.py), so a person's words never ping, link or format; Feishu gets
    the line as literal text tags (core/escape.py feishu_post), as the chat app's replies."""
    line = f"[tuneloop] {goal_id}: {text}"
    if fmt == "slack":
        said = escape.slack(line)
        return {"text": said, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": said}}]}
    if fmt == "feishu":  # a post of text tags: a person's <at user_id="all"> is shown, never an @all
        return {"msg_type": "post", "content": {"post": escape.feishu_post(line)}}
    return {"event": event, "goal_id": goal_id, "text": text, "data": data or {},
            "at": datetime.now(timezone.utc).isoformat()}


SIGNATURE_HEADER = "X-Tuneloop-Signature"
TIMESTAMP_HEADER = "X-Tuneloop-Timestamp"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def verify(secret: str, headers: Any, body: bytes, tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """True when the delivery's signature matches its body and its timestamp is recent (what a receiver does)."""
    low = {str(k).lower(): v for k, v in dict(headers).items()}
    ts, got = low.get(TIMESTAMP_HEADER.lower()), low.get(SIGNATURE_HEADER.lower())
    if not ts or not got or not ts.isdigit():
        return False
    if abs((time.time() if now is None else now) - int(ts)) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, int(ts), body), got)


def feishu_sign(secret: str, timestamp: int) -> str:
    """Feishu's custom-bot signature: base64(HMAC-SHA256(key="<timestamp>\n<secret>", msg=b""))."""
    mac = hmac.new(f"{timestamp}\n{secret}".encode(), b"", hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def signed(hook: Webhook, body: dict[str, Any], timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
    """The bytes to POST and their headers (signed when the hook has a secret)."""
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {"Content-Type": "application/json"}
    if hook.secret is not None:
        secret = hook.secret.get_secret_value()
        if hook.format == "feishu":
            body = {"timestamp": str(ts), "sign": feishu_sign(secret, ts), **body}
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        headers |= {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: sign(secret, ts, data)}
        return data, headers
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), headers


class Notifier:
    def __init__(self, hooks: tuple[Webhook, ...] | list[Webhook], attempts: int = 3, timeout_s: float = 5.0,
                 sinks: list[Callable[[str, str, str, dict[str, Any]], bool]] | None = None):
        self.hooks = list(hooks)
        # the chat apps (api/chatops): called with each event on the same thread, after the webhooks
        self.sinks = list(sinks or [])
        self.attempts, self.timeout_s = attempts, timeout_s
        self._q: queue.Queue[tuple[str, str, str, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0

    def notify(self, event: str, goal_id: str, text: str, data: dict[str, Any] | None = None) -> None:
        if event not in EVENTS:
            raise FieldError("event", f"must be one of {list(EVENTS)}, got {event!r}")
        if not self.hooks and not self.sinks:
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._deliver_forever, name="webhooks", daemon=True)
            self._thread.start()
        self._q.put((event, goal_id, text, data or {}))

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=self.timeout_s * self.attempts + 1)

    def _deliver_forever(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while (item := self._q.get()) is not None:
                for hook in self.hooks:
                    self._post(client, hook, payload(hook.format, *item))
                for sink in self.sinks:
                    self._sink(sink, item)

    def _sink(self, sink: Callable[[str, str, str, dict[str, Any]], bool], item: tuple[Any, ...]) -> None:
        try:
            if sink(*item):  # True: it posted something (a card, a message)
                self.sent += 1
        except Exception as e:  # a chat app's error may quote its request: log where and the error class only
            self.failed += 1
            log.warning("chat app %s: %s not delivered: %s", getattr(sink, "__qualname__", "sink"), item[0],
                        type(e).__name__)

    def _post(self, client: httpx.Client, hook: Webhook, body: dict[str, Any]) -> None:
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.attempts), wait=wait_exponential(0.1, max=2),
                                    retry=retry_if_exception_type((_Retryable, httpx.TransportError)), reraise=True):
                with attempt:
                    data, headers = signed(hook, body)  # signed per attempt: a fresh timestamp
                    r = client.post(hook.url.get_secret_value(), content=data, headers=headers)
                    if r.status_code >= 500:
                        raise _Retryable(f"HTTP {r.status_code}")
                    r.raise_for_status()
            self.sent += 1
        except Exception as e:  # the URL is a secret: log the format and the error class only
            self.failed += 1
            log.warning("webhook (%s) not delivered: %s", hook.format, type(e).__name__)
