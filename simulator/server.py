"""`tuneloop sim serve`: the simulated cluster behind an OpenAI-compatible HTTP API, in real time.

Started like a real engine, so the executor and the load generator drive it exactly as they drive
vLLM. One driver task owns the Cluster and maps wall time to virtual time (`--time-scale` virtual
seconds per wall second); it wakes at the next simulated event, but at most once per tick, and
hands each request the events due since (one SSE chunk per request per wake: a decode step's
tokens, or several steps' when the scale makes steps shorter than the tick). Prompt tokens are
whitespace words; prefix-cache block hashes are chained hashes of 64-word blocks. The output is
always max_tokens long (the simulator has no EOS: ignore_eos / min_tokens hold trivially) unless
the truncate fault cuts it. `/sim/info` reports the driver's own lag (how late events went out).
`/sim/records` returns the server's own per-request records in virtual
seconds: the ground truth a client measurement is checked against.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from typing import Any, List, Optional

import typer
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from core import profiles
from core.records import RequestRecord
from simulator import experts
from simulator.cluster import Cluster
from simulator.request import Event
from simulator.faults import Faults
from simulator.prefix_cache import block_hashes

TICK_S = 0.005  # shortest wall-clock gap between two driver wakes


class SimService:
    """The Cluster in real time: submit requests, stream their events, expose metrics and truth."""

    def __init__(self, cluster: Cluster, time_scale: float, crash_after: int | None = None):
        self.cluster = cluster
        self.scale = time_scale
        self.crash_after = crash_after
        self.w0 = time.perf_counter_ns()
        self.queues: dict[int, asyncio.Queue] = {}
        self.truth: dict[int, RequestRecord] = {}
        self.served = 0
        self.next_id = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.lags: collections.deque[float] = collections.deque(maxlen=100_000)  # wall s late, per wake
        self.expert_marks: dict[str, dict | None] = {"start": None, "stop": None}  # expert-distribution recorder

    def lag_ms(self) -> dict[str, float | int | None]:
        """How late the driver handed out events (wall ms past their virtual due time, per wake): the
        server's own scheduling lag, which a busy machine adds to what every client measures."""
        xs = sorted(self.lags)
        pick = lambda q: round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3, 3) if xs else None  # noqa: E731
        return {"wakes": len(xs), "p50": pick(0.5), "p99": pick(0.99), "max": pick(1.0)}

    def vnow(self) -> float:
        return (time.perf_counter_ns() - self.w0) / 1e9 * self.scale

    def advance(self) -> None:
        """Run the cluster to now and hand each request the events due (one list per request)."""
        per: dict[int, list[Event]] = {}
        now = self.vnow()
        for ev in self.cluster.run_until(now):
            per.setdefault(ev.req_id, []).append(ev)
        if per:
            self.lags.append(max(0.0, now - min(ev.t for evs in per.values() for ev in evs)) / self.scale)
        for rid, evs in per.items():
            rec = self.truth[rid]
            for ev in evs:
                if ev.kind in ("first", "chunk"):
                    rec.chunk_times.append(ev.t)
                    rec.chunk_tokens.append(ev.n_tokens)
                    if ev.kind == "first":
                        rec.n_cached = ev.n_cached
                else:
                    rec.n_out, rec.finish_reason, rec.ok = ev.n_out, ev.finish_reason, True
            q = self.queues.get(rid)
            if q is not None:
                q.put_nowait(evs)

    async def drive(self) -> None:
        while True:
            self.advance()
            nxt = self.cluster.next_event_time()
            delay = None if nxt is None else max((nxt - self.vnow()) / self.scale, TICK_S)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            else:
                await asyncio.sleep(TICK_S)  # coalesce a burst of arrivals into one wake

    def submit(self, n_in_words: list[str], n_out: int) -> tuple[int, asyncio.Queue]:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.drive())
        self.advance()
        rid = self.next_id
        self.next_id += 1
        self.served += 1
        if self.crash_after is not None and self.served > self.crash_after:
            print(f"simulated crash after {self.crash_after} requests (fault crash_at)", file=sys.stderr, flush=True)
            os._exit(137)
        t = self.vnow()
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        self.truth[rid] = RequestRecord(id=rid, t_sched=t, t_send=t, chunk_tokens=[], n_in=len(n_in_words),
                                        n_out_expected=n_out, http_status=200)
        self.cluster.submit(rid, len(n_in_words), n_out, block_hashes(n_in_words), t)
        self.wake.set()
        return rid, q

    def reset_prefix_cache(self) -> int:
        """vLLM's POST /reset_prefix_cache: drop every cached block (hit counters keep counting)."""
        self.advance()
        return sum(inst.cache.clear() for inst in self.cluster.prefill)

    def expert_distribution(self, action: str) -> dict:
        """SGLang's /start_, /stop_, /dump_expert_distribution_record: routed tokens per EP rank since start
        (or since launch), frozen at stop; the dump answers the record (core.records.EXPERT_LOAD's shape)."""
        self.advance()
        now = experts.record(self.cluster.decode)
        if action == "start":
            self.expert_marks = {"start": now, "stop": None}
        elif action == "stop":
            self.expert_marks["stop"] = now
        return experts.since(self.expert_marks["start"], self.expert_marks["stop"] or now)

    def metrics(self) -> str:
        self.advance()
        return (self.cluster.metrics_text() + "# TYPE tuneloop_sim_requests_total counter\n"
                f"tuneloop_sim_requests_total {self.served}\n"
                f"# TYPE tuneloop_sim_virtual_seconds gauge\ntuneloop_sim_virtual_seconds {self.vnow():.6f}\n")


def _err(status: int, msg: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": msg, "type": "BadRequestError", "param": field, "code": status}},
                        status_code=status)


def create_app(svc: SimService, model: str, healthy: bool = True) -> FastAPI:
    app = FastAPI(title="tuneloop simulated cluster")

    @app.get("/health")
    async def health():
        return Response(status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(svc.metrics(), media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        return {"success": True, "dropped_blocks": svc.reset_prefix_cache()}  # vLLM's answer: {"success": bool}

    @app.post("/start_expert_distribution_record")
    async def start_expert_record():
        svc.expert_distribution("start")
        return {"recording": True}

    @app.post("/stop_expert_distribution_record")
    async def stop_expert_record():
        svc.expert_distribution("stop")
        return {"recording": False}

    @app.post("/dump_expert_distribution_record")
    async def dump_expert_record():
        return svc.expert_distribution("dump")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "tuneloop"}]}

    @app.post("/tokenize")
    async def tokenize(req: Request):
        body = await req.json()
        text = body.get("prompt") if "prompt" in body else " ".join(m.get("content", "") for m in body.get("messages", []))
        return {"count": len(str(text or "").split()), "max_model_len": 1 << 20}

    @app.get("/sim/records")
    async def records():
        svc.advance()
        return PlainTextResponse("".join(r.model_dump_json() + "\n" for r in svc.truth.values()))

    @app.get("/sim/info")
    async def info():
        return {"cards": svc.cluster.cards, "time_scale": svc.scale, "model": model, "knobs": svc.cluster.knobs,
                "served": svc.served, "virtual_now": svc.vnow(), "emit_lag_ms": svc.lag_ms()}

    async def complete(req: Request, chat: bool):
        if not healthy:
            return _err(503, "engine not healthy")
        try:
            body = await req.json()
        except ValueError:
            return _err(400, "body: not valid JSON")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return _err(400, "messages: required, a non-empty list", "messages")
            text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            text = body.get("prompt")
            if not isinstance(text, str):
                return _err(400, "prompt: required, a string", "prompt")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _err(400, f"max_tokens: must be an integer >= 1, got {max_tokens!r}", "max_tokens")
        words = text.split()
        if not words:
            return _err(400, "prompt: must contain at least one token", "prompt")
        rid, q = svc.submit(words, max_tokens)
        opts = body.get("stream_options") or {}
        kind = "chat.completion.chunk" if chat else "text_completion"
        cid = f"{'chatcmpl' if chat else 'cmpl'}-sim{rid}"
        n_in = len(words)

        def usage(n_out: int, n_cached: int | None, final: bool) -> dict:
            u = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
            if final:
                u["prompt_tokens_details"] = {"cached_tokens": n_cached or 0}
            return u

        async def events():
            n_out, n_cached, finish = 0, None, None
            try:
                while finish is None:
                    evs = await q.get()
                    while not q.empty():  # behind after a stall: one chunk for all that is due, not one per wake
                        evs = evs + q.get_nowait()
                    toks = 0
                    for ev in evs:
                        if ev.kind == "first":
                            n_cached = ev.n_cached
                        if ev.kind == "finish":
                            finish = ev
                        else:
                            toks += ev.n_tokens
                    if toks:
                        n_out += toks
                        yield n_out, n_cached, toks, finish
                    elif finish is not None:
                        yield n_out, n_cached, 0, finish
            finally:
                svc.queues.pop(rid, None)

        if not body.get("stream"):
            n_out, n_cached, fin = 0, None, None
            async for n_out, n_cached, _, fin in events():
                pass
            choice = ({"index": 0, "message": {"role": "assistant", "content": " tok" * n_out}} if chat
                      else {"index": 0, "text": " tok" * n_out})
            choice["finish_reason"] = fin.finish_reason
            return JSONResponse({"id": cid, "object": "chat.completion" if chat else "text_completion",
                                 "model": model, "choices": [choice], "usage": usage(n_out, n_cached, True)})

        cont = bool(opts.get("continuous_usage_stats"))

        async def sse():
            async for n_out, n_cached, toks, fin in events():
                text = " tok" * toks
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                choice["finish_reason"] = fin.finish_reason if fin is not None else None
                obj: dict[str, Any] = {"id": cid, "object": kind, "model": model, "choices": [choice]}
                if cont:
                    obj["usage"] = usage(n_out, n_cached, False)
                yield f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
                if fin is not None and opts.get("include_usage"):
                    u = {"id": cid, "object": kind, "model": model, "choices": [], "usage": usage(n_out, n_cached, True)}
                    yield f"data: {json.dumps(u, separators=(',', ':'))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(req: Request):
        return await complete(req, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: Request):
        return await complete(req, chat=True)

    return app


def parse_knobs(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"--knob {item!r}: expected name=value")
        out[k] = yaml.safe_load(v)
    return out


def serve(
    profile: str = typer.Option(..., help="simulator profile name or YAML path"),
    knob: List[str] = typer.Option([], help="server knob name=value (catalog names), repeatable"),
    port: int = typer.Option(8000, help="TCP port"),
    host: str = typer.Option("127.0.0.1", help="bind address"),
    time_scale: float = typer.Option(1.0, help="virtual seconds per wall-clock second"),
    fault: List[str] = typer.Option([], help="fault injection: launch_failure, never_healthy, truncate=F, ..."),
    task: Optional[str] = typer.Option(None, help="workload type for MTP acceptance: copy | chat | code"),
    scenario_free: bool = typer.Option(True, "--scenario-free/--no-scenario-free",
                                       help="serve any prompt (the only mode; accepted for launch templates)"),
    expected_requests: Optional[int] = typer.Option(None, help="N for crash_at=F (required with it): crash after "
                                                                  "F*N requests"),
    seed: int = typer.Option(0, help="simulation seed"),
    model: Optional[str] = typer.Option(None, help="model id to report (default: the profile name)"),
) -> None:
    """Start an OpenAI-compatible server driven by the simulated cluster in real time."""
    import uvicorn  # deferred: uvicorn, only when the server runs


    if not time_scale > 0:
        raise typer.BadParameter(f"--time-scale {time_scale}: must be > 0")
    try:
        faults = Faults.parse(fault)
        prof = profiles.load(profile)
        cluster = Cluster(prof, parse_knobs(knob), seed=seed, faults=faults, task=task, stream=True)
    except (ValueError, FileNotFoundError, KeyError) as e:
        typer.echo(f"sim serve: {e}", err=True)
        raise typer.Exit(2)
    except RuntimeError as e:  # SimLaunchError: the engine failed to start
        typer.echo(f"sim serve: launch failed: {e}", err=True)
        raise typer.Exit(3)
    crash_after = None
    if faults.crash_at is not None:  # a server cannot know how many requests a load will send: it is told
        if expected_requests is None or expected_requests < 1:
            typer.echo(f"sim serve: --fault crash_at={faults.crash_at:g} needs --expected-requests N (N >= 1, the "
                       f"requests the load will send, warm-up included): the server crashes after "
                       f"crash_at * N of them; got {expected_requests!r}", err=True)
            raise typer.Exit(2)
        crash_after = int(faults.crash_at * expected_requests)
    svc = SimService(cluster, time_scale, crash_after)
    app = create_app(svc, model or prof.name, healthy=cluster.healthy)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=600)
