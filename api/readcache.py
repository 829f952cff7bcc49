"""The read cache: what dashboards poll is computed once per change of the store, not once per request.

A GET of a read route (goals, candidates, decisions, experiments, stations, budget, /health, /metrics; not reports,
images, chat or the dashboard page) is answered from the last answer to the same path, query and token while

* the store's change stamp (state.db.Database.change_stamp: any commit by any process changes it) is the one read
  before that answer was computed, and
* that answer is younger than `read_cache_s` (what does not live in the store, such as a running load's request
  count from its progress.json or the elapsed time, is never older than that),

or, whatever the stamp, while it is younger than REUSE_S (0.25 s): a running loop commits many times a second, and
a dashboard does not need each of those commits within a quarter of a second. That latitude is only for what
other processes (the worker process) commit: after a commit through this process's own store (its
`local_writes` moved) an answer is computed afresh, so everything this process writes is read back at once.
Past that, an answer the store has moved on from (or half of `read_cache_s` old) is still served while one
background computation replaces it, so a reader never waits for a recomputation unless nothing younger than
`read_cache_s` is there. A request of this
process that may write (anything but GET / HEAD) empties the cache when it ends, so a client reads its own writes.

Concurrent misses of one key wait for a single computation (no stampede after each commit of a running loop). Only
200 answers are kept; `read_cache_s` = 0 turns the cache off. The guard (api/guard.py) runs before it, so a token is
checked on every request, cached or not.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

UNCACHED = re.compile(r"^/$|^/(docs|redoc|openapi\.json)|/report(\.md)?$|/images/|/chat$")
MAX_ENTRIES = 4096
REUSE_S = 0.25
MAX_BODY = 8 << 20


class Entry:
    __slots__ = ("stamp", "local", "at", "start", "body", "route")

    def __init__(self, stamp: Any, local: int, at: float, start: Message, body: bytes, route: Any):
        self.stamp, self.local, self.at, self.start, self.body, self.route = stamp, local, at, start, body, route


class ReadCache:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.entries: dict[tuple[str, bytes, bytes], Entry] = {}
        self.inflight: dict[tuple[str, bytes, bytes], asyncio.Future[Entry | None]] = {}
        self.refreshing: set[asyncio.Task[None]] = set()
        self.hits = self.misses = self.writes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        svc = getattr(scope["app"].state, "service", None) if scope["type"] == "http" else None
        if svc is None or svc.settings.read_cache_s <= 0:
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            try:
                await self.app(scope, receive, send)
            finally:
                self.writes += 1  # it may have written: the next read computes afresh
                self.entries.clear()
            return
        if scope["method"] != "GET" or UNCACHED.search(scope["path"]):
            await self.app(scope, receive, send)
            return
        auth = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        key = (scope["path"], scope.get("query_string", b""), auth)
        now = time.monotonic()
        limit = svc.settings.read_cache_s
        local = svc.store.local_writes
        hit = self.entries.get(key)
        if hit is not None and hit.local != local:
            hit = None  # this process committed since: exact, as in one process
        if hit is not None and now - hit.at < min(REUSE_S, limit):
            self.hits += 1
            await _replay(hit, scope, send)
            return
        try:
            stamp = svc.store.change_stamp()
        except Exception:  # the store does not answer: let the route say so
            stamp = None
        if stamp is None:
            await self.app(scope, receive, send)
            return
        if hit is not None and now - hit.at < limit:
            self.hits += 1
            if (hit.stamp != stamp or now - hit.at >= limit / 2) and key not in self.inflight:
                fut = self.inflight[key] = asyncio.get_running_loop().create_future()
                task = asyncio.create_task(self._compute(dict(scope), _no_body, _discard, key, stamp, local, now, fut))
                self.refreshing.add(task)
                task.add_done_callback(self.refreshing.discard)
            await _replay(hit, scope, send)
            return
        pending = self.inflight.get(key)
        if pending is not None:
            entry = await asyncio.shield(pending)
            if entry is not None and entry.local == local:
                self.hits += 1
                await _replay(entry, scope, send)
                return
        fut = self.inflight[key] = asyncio.get_running_loop().create_future()
        await self._compute(scope, receive, send, key, stamp, local, now, fut)

    async def _compute(self, scope: Scope, receive: Receive, send: Send, key: tuple[str, bytes, bytes], stamp: Any,
                       local: int, now: float, fut: asyncio.Future[Entry | None]) -> None:
        """Run the route (for a request, or in the background to refresh an entry still being served) and keep a
        200 answer, unless a write request of this process ended meanwhile."""
        self.misses += 1
        start: Message = {}
        chunks: list[bytes] = []

        async def capture(msg: Message) -> None:
            nonlocal start
            if msg["type"] == "http.response.start":
                start = msg
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))
            await send(msg)

        entry: Entry | None = None
        writes = self.writes
        try:
            await self.app(scope, receive, capture)
            body = b"".join(chunks)
            if start.get("status") == 200 and len(body) <= MAX_BODY and writes == self.writes:
                entry = Entry(stamp, local, now, start, body, scope.get("route"))
                if len(self.entries) >= MAX_ENTRIES:
                    self.entries.clear()  # paths are bounded by what exists; a flood of odd queries only resets it
                self.entries[key] = entry
        except Exception:
            if send is _discard:  # a background refresh that failed: the next request computes it itself
                return
            raise
        finally:
            if self.inflight.get(key) is fut:
                del self.inflight[key]
            fut.set_result(entry)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(msg: Message) -> None:
    return None


async def _replay(e: Entry, scope: Scope, send: Send) -> None:
    scope["route"] = e.route  # the request metrics count a cached answer under its route
    await send(e.start)
    await send({"type": "http.response.body", "body": e.body, "more_body": False})
