"""The scraper: every engine instance's (and rank endpoint's) Prometheus /metrics polled about once a second during a
load, each sample appended to metrics.jsonl under its role and its instance's name (labels folded into the series
name), with its own timestamp (when its answer arrived) and the round it belongs to.

Every endpoint is polled concurrently, each request bounded by its own timeout: a dead or silent endpoint costs its
own sample, never the others' (an endpoint still answering the last round is skipped this round, not asked twice).
When the load ends (`stop`), requests still in flight are dropped and every endpoint is asked once more (the closing
sample: counters read over the whole load, as `vllm bench serve` reads its before/after pair), each again bounded by
its timeout, so the scraper returns within one timeout of the stop whatever an endpoint does.

`--metrics-url NAME=URL` names one instance (`decode-1`, the service's name), one rank endpoint of an instance whose
ranks each serve their own /metrics (`decode-1.r3`: rank 3 of decode-1), one node of an instance spanning hosts
(`decode-1.n2`: its third host, whose ranks its labels name), or a bare role; the digest
(executor/evidence.py) reads the samples back per role, per instance and per rank (executor/evidence_ranks.py).
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Iterable, Sequence

import httpx

from core.records import EngineSample, JsonlWriter

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {name{labels}: value}; comments and malformed lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


_NAME = re.compile(r"(prefill|decode|mixed)(-[0-9]+(\.[rn][0-9]+)?)?")
TIMEOUT_S = 2.0  # one request's bound: a silent endpoint costs this, and the closing round at most this
MIN_WAIT_S = 0.001  # the shortest wait between rounds (a round's deadline just passed): the loop always yields


def parse_endpoints(specs: Iterable[str]) -> list[tuple[str, str]]:
    """`NAME=URL` strings -> [(name, url)], NAME a role, one instance of it (`decode-1`, the service's name), one
    rank endpoint of an instance (`decode-1.r3`) or one node of a multi-host instance (`decode-1.n2`); a bad spec or
    a name given twice names itself and the reason."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not _NAME.fullmatch(name) or not url.startswith(("http://", "https://")):
            raise ValueError(f"--metrics-url {spec!r}: expected NAME=URL with NAME a role (prefill|decode|mixed), "
                             "one instance of it (decode-1), one rank endpoint of an instance (decode-1.r3) or one "
                             "node of it (decode-1.n2), and an http(s) URL")
        if "-" in name and any(n == name for n, _ in out):
            raise ValueError(f"--metrics-url {spec!r}: instance {name} is given twice")
        out.append((name, url))
    return out


def instance_name(name: str, index: int, url: str) -> tuple[str, str]:
    """(role, instance) a scrape is recorded under: a named instance (or rank endpoint) keeps its name (the report
    names it); a bare role gets its place in the list and its URL, so two URLs of one role stay apart."""
    role = name.split("-", 1)[0]
    return role, (name if "-" in name else f"{role}{index}@{url}")


async def scrape_loop(endpoints: Sequence[tuple[str, str]], path: Path, t0_ns: int, stop: asyncio.Event,
                      interval_s: float = 1.0, timeout_s: float = TIMEOUT_S) -> int:
    """Poll every endpoint concurrently each interval until `stop` is set, then once more (the closing sample);
    returns samples written. Each sample carries its own time (its answer's arrival, on the load's clock from
    t0_ns) and its round (the interval it was asked in; the closing round is the last)."""
    if not endpoints:
        return 0
    named = [(instance_name(name, i, url), url) for i, (name, url) in enumerate(endpoints)]
    written = 0
    limits = httpx.Limits(max_connections=len(named) + 4, max_keepalive_connections=len(named))
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        with JsonlWriter(path) as w:
            async def one(k: int, rnd: int) -> None:
                nonlocal written
                (role, inst), url = named[k]
                try:  # bounded as a whole (httpx bounds each read): a trickling answer costs the timeout too
                    r = await asyncio.wait_for(client.get(url), timeout_s)
                    r.raise_for_status()
                except (httpx.HTTPError, asyncio.TimeoutError):
                    return  # a missed scrape (refused, timed out, an error status) is a gap in the series
                t = (time.perf_counter_ns() - t0_ns) / 1e9
                w.write(EngineSample(t=t, role=role, instance=inst, values=parse_prometheus(r.text), round=rnd))
                written += 1

            busy: dict[int, asyncio.Task] = {}
            start, rnd = time.perf_counter(), 0
            try:
                while not stop.is_set():
                    for k in range(len(named)):
                        if k in busy and not busy[k].done():
                            continue  # still answering the last round: not asked twice
                        if k in busy and busy[k].exception() is not None:
                            raise busy[k].exception()  # not a missed scrape: a fault of the scraper's own
                        busy[k] = asyncio.create_task(one(k, rnd))
                    # the next round on the interval's grid (a late loop skips the rounds it missed, never bunches)
                    rnd = max(rnd + 1, int((time.perf_counter() - start) / interval_s) + 1)
                    try:  # a positive timeout: wait_for(..., 0) raises TimeoutError even when the event is set
                        await asyncio.wait_for(stop.wait(), timeout=max(start + rnd * interval_s - time.perf_counter(),
                                                                        MIN_WAIT_S))
                    except asyncio.TimeoutError:
                        pass
            finally:
                for task in busy.values():  # an answer still owed was asked before the load ended: not the close
                    task.cancel()
                for got in await asyncio.gather(*busy.values(), return_exceptions=True):
                    if isinstance(got, Exception):
                        raise got
            await asyncio.gather(*(one(k, rnd) for k in range(len(named))))
            return written
