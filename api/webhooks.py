"""Outgoing notifications: approval needed, a decision made, the loop stopped.

Payload shapes: generic JSON, Slack-compatible (`text` + mrkdwn `blocks`), Feishu-compatible
(`msg_type: text`). Delivery runs on one background thread so the loop never waits on a chat
server; a failed POST is retried a bounded number of times (transport errors and 5xx only).
"""
from __future__ import annotations

import logging
import queue
import threading
from datetime import datetime, timezone
from typing import Any

import httpx
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from api.settings import Webhook

log = logging.getLogger("tuneloop.webhooks")
EVENTS = ("approval_needed", "decision", "stopped")


class _Retryable(Exception):
    pass


def payload(fmt: str, event: str, goal_id: str, text: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body for one notification in the given format (pure)."""
    line = f"[tuneloop] {goal_id}: {text}"
    if fmt == "slack":
        return {"text": line, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": line}}]}
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": line}}
    return {"event": event, "goal_id": goal_id, "text": text, "data": data or {},
            "at": datetime.now(timezone.utc).isoformat()}


class Notifier:
    def __init__(self, hooks: tuple[Webhook, ...] | list[Webhook], attempts: int = 3, timeout_s: float = 5.0):
        self.hooks = list(hooks)
        self.attempts, self.timeout_s = attempts, timeout_s
        self._q: queue.Queue[tuple[str, str, str, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0

    def notify(self, event: str, goal_id: str, text: str, data: dict[str, Any] | None = None) -> None:
        if event not in EVENTS:
            raise ValueError(f"event: must be one of {list(EVENTS)}, got {event!r}")
        if not self.hooks:
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

    def _post(self, client: httpx.Client, hook: Webhook, body: dict[str, Any]) -> None:
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.attempts), wait=wait_exponential(0.1, max=2),
                                    retry=retry_if_exception_type((_Retryable, httpx.TransportError)), reraise=True):
                with attempt:
                    r = client.post(hook.url.get_secret_value(), json=body)
                    if r.status_code >= 500:
                        raise _Retryable(f"HTTP {r.status_code}")
                    r.raise_for_status()
            self.sent += 1
        except Exception as e:  # the URL is a secret: log the format and the error class only
            self.failed += 1
            log.warning("webhook (%s) not delivered: %s", hook.format, type(e).__name__)
