"""The scraper: every engine instance's Prometheus /metrics polled about once a second during a load, each sample
appended to metrics.jsonl under its role and its instance's name (labels folded into the series name).

`--metrics-url NAME=URL` names one instance (`decode-1`, the service's name) or a bare role; the digest
(executor/evidence.py) reads the samples back per role and per instance.
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


_NAME = re.compile(r"(prefill|decode|mixed)(-[0-9]+)?")


def parse_endpoints(specs: Iterable[str]) -> list[tuple[str, str]]:
    """`NAME=URL` strings -> [(name, url)], NAME a role or one instance of it (`decode-1`, the service's name);
    a bad spec or a name given twice names itself and the reason."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not _NAME.fullmatch(name) or not url.startswith(("http://", "https://")):
            raise ValueError(f"--metrics-url {spec!r}: expected NAME=URL with NAME a role (prefill|decode|mixed) "
                             "or one instance of it (decode-1), and an http(s) URL")
        if "-" in name and any(n == name for n, _ in out):
            raise ValueError(f"--metrics-url {spec!r}: instance {name} is given twice")
        out.append((name, url))
    return out


def instance_name(name: str, index: int, url: str) -> tuple[str, str]:
    """(role, instance) a scrape is recorded under: a named instance keeps its service name (the report names
    it); a bare role gets its place in the list and its URL, so two URLs of one role stay apart."""
    role = name.split("-", 1)[0]
    return role, (name if "-" in name else f"{role}{index}@{url}")


async def scrape_loop(endpoints: Sequence[tuple[str, str]], path: Path, t0_ns: int, stop: asyncio.Event,
                      interval_s: float = 1.0) -> int:
    """Poll every endpoint each interval until `stop` is set, then once more (the closing sample: counters read
    over the whole load, as `vllm bench serve` reads its before/after pair); returns samples written."""
    n = 0
    if not endpoints:
        return 0
    async with httpx.AsyncClient(timeout=max(interval_s, 0.5)) as client:
        with JsonlWriter(path) as w:
            closing = False
            while True:
                tick = time.perf_counter_ns()
                for i, (name, url) in enumerate(endpoints):
                    try:
                        r = await client.get(url)
                        r.raise_for_status()
                    except httpx.HTTPError:
                        continue  # a missed scrape is a gap in the series, not a failed load
                    t = (time.perf_counter_ns() - t0_ns) / 1e9
                    role, inst = instance_name(name, i, url)
                    w.write(EngineSample(t=t, role=role, instance=inst, values=parse_prometheus(r.text)))
                    n += 1
                if closing:
                    return n
                left = interval_s - (time.perf_counter_ns() - tick) / 1e9
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(left, 0.0))
                    closing = True
                except asyncio.TimeoutError:
                    pass
