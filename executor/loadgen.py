"""The load generator: an asyncio OpenAI-compatible streaming client that writes raw records.

One dispatcher walks the arrival schedule (t_sched), takes a slot of the concurrency cap C
(t_send), and starts the request; each finished request is appended to requests.jsonl and flushed
at once, so a crash loses no finished request. Summarising is a separate step (executor.collect).

Input token counts come back from the server in `usage.prompt_tokens` (the simulator counts words);
against a real engine that offers `/tokenize` (vLLM, SGLang, llama.cpp), `tokenize_counts` gives the
exact count of a prompt before sending. Output length is fixed with max_tokens + min_tokens +
ignore_eos, and usage is asked for with stream_options.include_usage (plus vLLM's
continuous_usage_stats, which lets the client know how many tokens each chunk carried).

Streams are read with aiohttp (as `vllm bench serve` does): its C HTTP parser and `iter_any()`
hand over whatever bytes have arrived in one block, about 5x less client CPU per token than
httpx/h11's per-chunk events (bench/client_ceiling.py). httpx stays for the short JSON calls.
The arrival schedule is core.scenarios.send_times (core.arrivals.schedule, or a trace's own arrival
times), so a seed gives the same send times as the virtual-time run.
"""
from __future__ import annotations

import asyncio
import gc
import json
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import aiohttp
import httpx

from core import records as rec
from core import scenarios
from core.arrivals import schedule as sim_schedule
from core.records import JsonlWriter, RequestRecord, RunInfo
from executor.evidence import scrape_loop
from executor.sse import DONE, SSEParser

ARRIVALS = ("constant", "poisson", "gamma")


@dataclass(frozen=True)
class LoadConfig:
    endpoint: str  # base URL (http://host:port) or a full /v1/... URL
    n: int
    concurrency: int
    request_rate: float = math.inf
    warmup: int = 0
    arrival: str = "constant"
    burstiness: float = 1.0
    api: str = "completions"
    model: str | None = None
    seed: int = 0
    timeout_s: float = 3600.0
    continuous_usage: bool = True
    metrics_urls: tuple[tuple[str, str], ...] = ()
    extra_body: dict = field(default_factory=dict)

    def check(self) -> None:
        for name, ok, why in (("n", self.n >= 1, "must be >= 1"), ("concurrency", self.concurrency >= 1, "must be >= 1"),
                              ("request_rate", self.request_rate > 0, "must be > 0 (inf allowed)"),
                              ("warmup", self.warmup >= 0, "must be >= 0"),
                              ("arrival", self.arrival in ARRIVALS, f"must be one of {ARRIVALS}"),
                              ("burstiness", self.burstiness > 0, "must be > 0"),
                              ("api", self.api in ("completions", "chat"), "must be completions or chat"),
                              ("endpoint", self.endpoint.startswith(("http://", "https://")), "must be an http(s) URL")):
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

    def url(self) -> str:
        if "/v1/" in self.endpoint:
            return self.endpoint
        return self.endpoint.rstrip("/") + ("/v1/completions" if self.api == "completions" else "/v1/chat/completions")


def schedule(n: int, rate: float, arrival: str = "constant", burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s from the formal start): the simulator's own arrival process, so runs match for a seed."""

    return sim_schedule(n, rate, arrival, burstiness, seed)


def body(cfg: LoadConfig, model: str, prompt: str, n_out: int) -> dict:
    opts = {"include_usage": True}
    if cfg.continuous_usage:
        opts["continuous_usage_stats"] = True
    b = {"model": model, "max_tokens": n_out, "min_tokens": n_out, "ignore_eos": True, "stream": True,
         "stream_options": opts, "temperature": 0.0}
    if cfg.api == "chat":
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    b.update(cfg.extra_body)
    return b


async def send_one(session: aiohttp.ClientSession, cfg: LoadConfig, payload: dict, r: RequestRecord,
                   t0: int) -> RequestRecord:
    """Stream one request into `r` (t_sched/t_send already set); every failure is recorded, never raised.
    Events that arrived in one read share that read's timestamp (the bytes came together)."""
    times, toks, last_cum = r.chunk_times, [], 0
    per_chunk_known = cfg.continuous_usage
    api, rid = cfg.api, None  # locals: a pydantic attribute read per event costs more than the parse
    try:
        async with session.post(cfg.url(), json=payload) as resp:
            r.http_status = resp.status
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")[:300]
                r.error = f"HTTP {resp.status}: {text}"
                return r
            parser, done = SSEParser(), False
            async for raw in resp.content.iter_any():
                t = (time.perf_counter_ns() - t0) / 1e9
                for data in parser.feed(raw):
                    if data == DONE:
                        done = True
                        continue
                    obj = json.loads(data)
                    choices = obj.get("choices")
                    if "error" in obj and not choices:
                        err = obj["error"]
                        r.error = "stream error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
                        return r
                    usage = obj.get("usage")
                    if rid is None:
                        rid = r.response_id = obj.get("id")  # correlates the record with the server's logs
                    if choices:
                        c = choices[0]
                        if (c.get("text") if api == "completions" else (c.get("delta") or {}).get("content")):
                            times.append(t)
                            if usage and usage.get("completion_tokens") is not None:
                                toks.append(usage["completion_tokens"] - last_cum)
                                last_cum = usage["completion_tokens"]
                            else:
                                per_chunk_known = False
                        if c.get("finish_reason"):
                            r.finish_reason = c["finish_reason"]
                    if usage:
                        r.n_in = usage.get("prompt_tokens", r.n_in)
                        r.n_out = usage.get("completion_tokens", r.n_out)
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            r.n_cached = details["cached_tokens"]
            if not done and r.finish_reason is None:
                r.error = "stream ended without finish_reason or [DONE]"
                return r
            if per_chunk_known and toks and sum(toks) == r.n_out:
                r.chunk_tokens = toks
            r.ok = r.finish_reason is not None
            if not r.ok:
                r.error = "no finish_reason in stream"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        r.t_end = (time.perf_counter_ns() - t0) / 1e9
    return r


async def discover_model(client: httpx.AsyncClient, endpoint: str) -> str:
    base = endpoint.split("/v1/")[0].rstrip("/")
    resp = await client.get(base + "/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def tokenize_counts(client: httpx.AsyncClient, endpoint: str, model: str, prompts: Sequence[str]) -> list[int]:
    """Exact input token counts from an engine's /tokenize endpoint (vLLM, SGLang, llama.cpp shapes)."""
    base = endpoint.split("/v1/")[0].rstrip("/")
    out = []
    for p in prompts:
        resp = await client.post(base + "/tokenize", json={"model": model, "prompt": p, "content": p})
        resp.raise_for_status()
        j = resp.json()
        out.append(j["count"] if "count" in j else len(j.get("tokens", [])))
    return out


async def run_load(cfg: LoadConfig, prompts, run_dir: Path, info: RunInfo) -> int:
    """Warm-up (excluded, awaited), then the formal load; records appended as they finish. Returns rc."""
    cfg.check()
    run_dir.mkdir(parents=True, exist_ok=True)
    rec.write_atomic(run_dir / rec.PID, f"{os.getpid()}\n")
    rec.write_atomic(run_dir / rec.RUN_INFO, info.model_dump_json(indent=1))
    t0 = time.perf_counter_ns()
    now = lambda: (time.perf_counter_ns() - t0) / 1e9  # noqa: E731
    stop = asyncio.Event()
    model = cfg.model
    if model is None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
            model = await discover_model(client, cfg.endpoint)
    # pool sized to C (aiohttp's default is 100); one connection per request (force_close, as vLLM's
    # benchmark_serving did): llama-server drops a kept-alive connection reused right after a streamed
    # response, which would fail requests the server never saw
    connector = aiohttp.TCPConnector(limit=cfg.concurrency + 4, force_close=True)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=30.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        scraper = asyncio.create_task(scrape_loop(cfg.metrics_urls, run_dir / rec.METRICS, t0, stop))
        sem = asyncio.Semaphore(cfg.concurrency)
        with JsonlWriter(run_dir / rec.REQUESTS) as w:
            async def go(spec, r):
                try:
                    w.write(await send_one(session, cfg, body(cfg, model, prompts(spec), spec.n_out), r, t0))
                finally:
                    sem.release()

            async def phase(specs, times, warm: bool):
                start, tasks = now(), []
                for spec, ts in zip(specs, times):
                    t_sched = start + ts
                    if t_sched > now():
                        await asyncio.sleep(t_sched - now())
                    await sem.acquire()
                    r = RequestRecord(id=spec.id, warmup=warm, t_sched=t_sched, t_send=now(),
                                      n_out_expected=spec.n_out, response_id=None)
                    tasks.append(asyncio.create_task(go(spec, r)))
                await asyncio.gather(*tasks)

            specs = prompts.specs
            # a full collection over a run's live objects stalled the dispatcher ~0.7 s (the queue-delay p99):
            # freeze what exists now and collect young objects less often while the load runs
            gc.collect()
            gc.freeze()
            threshold = gc.get_threshold()
            gc.set_threshold(50_000, 50, 1000)
            try:
                if cfg.warmup:
                    await phase(specs[:cfg.warmup], [0.0] * cfg.warmup, True)
                await phase(specs[cfg.warmup:], scenarios.send_times(prompts.scenario, cfg.n, cfg.request_rate,
                                                                     cfg.arrival, cfg.burstiness, cfg.seed), False)
            finally:
                gc.set_threshold(*threshold)
                gc.unfreeze()
                stop.set()
                await scraper
    return 0


async def _share_of_load(cfg: LoadConfig, scenario, model: str, run_dir: Path, times: list[float], t0: int,
                         credits, nxt) -> None:
    """One of K processes: claim the next request of the shared schedule, wait for its time and a credit
    of the shared budget, send; each finished record goes to requests.jsonl in one O_APPEND write."""
    prompts = ScenarioPrompts(scenario, cfg.n, 0)
    loop, waiter = asyncio.get_running_loop(), ThreadPoolExecutor(1)
    fd = os.open(run_dir / rec.REQUESTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    connector = aiohttp.TCPConnector(limit=cfg.concurrency + 4, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as s:
        async def go(spec, r):
            try:
                done = await send_one(s, cfg, body(cfg, model, prompts(spec), spec.n_out), r, t0)
                os.write(fd, (done.model_dump_json() + "\n").encode())
            finally:
                credits.release()

        tasks = []
        while True:
            with nxt.get_lock():
                i, nxt.value = nxt.value, nxt.value + 1
            if i >= cfg.n:
                break
            wait = times[i] - (time.perf_counter_ns() - t0) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            await loop.run_in_executor(waiter, credits.acquire)
            spec = prompts.specs[i]
            r = RequestRecord(id=spec.id, t_sched=times[i], t_send=(time.perf_counter_ns() - t0) / 1e9,
                              n_out_expected=spec.n_out, response_id=None)
            tasks.append(asyncio.create_task(go(spec, r)))
        await asyncio.gather(*tasks)
    os.close(fd)


def run_procs(cfg: LoadConfig, scenario, run_dir: Path, info: RunInfo, procs: int) -> int:
    """The formal load from K processes with ONE arrival schedule (a shared next-request counter) and ONE
    concurrency budget (a semaphore of C credits), for rates one process cannot stream. Times share one
    clock: perf_counter is CLOCK_MONOTONIC, the same in every process. Two requests due together may go
    out in either order. No warm-up here (run it single-process first)."""
    cfg.check()
    if procs < 1 or cfg.warmup:
        raise ValueError(f"procs={procs}, warmup={cfg.warmup}: procs must be >= 1 and warm-up run single-process")
    run_dir.mkdir(parents=True, exist_ok=True)
    rec.write_atomic(run_dir / rec.PID, f"{os.getpid()}\n")
    rec.write_atomic(run_dir / rec.RUN_INFO, info.model_dump_json(indent=1))
    model = cfg.model or asyncio.run(_discover(cfg.endpoint))
    ctx = mp.get_context("fork")
    credits, nxt = ctx.Semaphore(cfg.concurrency), ctx.Value("q", 0)
    sc = scenarios.load(scenario) if isinstance(scenario, str) else scenario
    times = scenarios.send_times(sc, cfg.n, cfg.request_rate, cfg.arrival, cfg.burstiness, cfg.seed)
    t0 = time.perf_counter_ns() + 300_000_000  # every process has started by then
    jobs = [ctx.Process(target=lambda: asyncio.run(_share_of_load(cfg, scenario, model, run_dir, times, t0, credits,
                                                                  nxt))) for _ in range(procs)]
    for j in jobs:
        j.start()

    async def watch():
        stop = asyncio.Event()
        scraper = asyncio.create_task(scrape_loop(cfg.metrics_urls, run_dir / rec.METRICS, t0, stop))
        await asyncio.get_running_loop().run_in_executor(None, lambda: [j.join() for j in jobs])
        stop.set()
        await scraper

    asyncio.run(watch())
    return 0 if all(j.exitcode == 0 for j in jobs) else 1


async def _discover(endpoint: str) -> str:
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        return await discover_model(client, endpoint)


class ScenarioPrompts:
    """Request specs of a scenario with their text made lazily (a 128K-word prompt is costly to build)."""

    def __init__(self, scenario, n: int, warmup: int, seed: int | None = None):

        self.scenario = scenarios.load(scenario) if isinstance(scenario, str) else scenario
        self.specs = scenarios.generate(self.scenario, n, warmup=warmup, seed=seed)

    def __call__(self, spec) -> str:
        return spec.prompt(self.scenario)


def run(cfg: LoadConfig, scenario: str, run_dir: Path, cards: int = 1, extra_info: dict | None = None,
        procs: int = 1) -> int:
    """Blocking entry point: run the load (procs > 1: run_procs), then write rc and the done marker (rc 1 on
    a crash of the client)."""
    prompts = ScenarioPrompts(scenario, cfg.n, cfg.warmup)
    sc = prompts.scenario
    info = RunInfo(scenario=scenario, scenario_version=sc.version, n=cfg.n, warmup=cfg.warmup,
                   concurrency=cfg.concurrency, request_rate=cfg.request_rate, arrival=cfg.arrival,
                   burstiness=cfg.burstiness, cards=cards, seed=cfg.seed, endpoint=cfg.endpoint,
                   output_len=sc.output_len, api=cfg.api, data_version=sc.data_version, **(extra_info or {}))
    rc = 1
    try:
        rc = (run_procs(cfg, scenario, Path(run_dir), info, procs) if procs > 1
              else asyncio.run(run_load(cfg, prompts, Path(run_dir), info)))
    finally:
        rec.mark_done(Path(run_dir), rc)
    return rc
