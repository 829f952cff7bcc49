"""A lean OpenAI-compatible streaming mock server (asyncio streams, HTTP/1.1 keep-alive, chunked).

For measuring the client's own ceiling and for client tests: it adds no delay unless asked
(`itl_ms`), streams one SSE event per token with the same framing uvicorn uses (one HTTP chunk per
event, pre-encoded and written 16 at a time so the server costs next to nothing per token), and honours max_tokens, stream_options.include_usage and continuous_usage_stats.
Faults for client tests: every `fail_every`-th stream sends an in-stream error object after two
tokens; every `http_error_every`-th request gets HTTP 500. `/metrics` reports requests and the most
streams ever in flight at once; `barrier` holds every stream until N are in flight (to check
that the client really reaches C).
Run: `python -m executor.mockserver --port N [--itl-ms X] [--fail-every K] [--http-error-every K] [--barrier N]
[--workers K]` (K forked processes share the listening socket).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket

MODEL = "mock"


class Counters:
    requests = 0
    inflight = 0
    max_inflight = 0
    barrier = 0  # hold every stream until this many are in flight at once (or 10 s pass)
    released: asyncio.Event | None = None


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


@functools.lru_cache(maxsize=64)
def _frames(n_out: int, n_in: int, chat: bool, cont: bool, usage: bool, fail: bool) -> tuple[bytes, ...]:
    """The whole response body pre-encoded, in groups of 16 events: the server's per-token cost is ~0."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for k in range(n_out):
        choice = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
        choice["finish_reason"] = "length" if k == n_out - 1 else None
        obj = {"id": "cmpl-mock", "object": kind, "model": MODEL, "choices": [choice]}
        if cont:
            obj["usage"] = {"prompt_tokens": n_in, "completion_tokens": k + 1, "total_tokens": n_in + k + 1}
        events.append(_event(obj))
        if fail and k == 1:
            events.append(_event({"error": {"message": "mock engine error", "type": "InternalServerError",
                                             "code": 500}}))
            break
    if usage and not fail:
        events.append(_event({"id": "cmpl-mock", "object": kind, "model": MODEL, "choices": [],
                              "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                        "total_tokens": n_in + n_out, "prompt_tokens_details": {"cached_tokens": 0}}}))
    events.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return tuple(events)


async def _stream(w: asyncio.StreamWriter, req: dict, chat: bool, itl_s: float, fail: bool) -> None:
    n_out = int(req.get("max_tokens") or 16)
    prompt = req.get("prompt") if not chat else " ".join(m.get("content", "") for m in req.get("messages", []))
    opts = req.get("stream_options") or {}
    frames = _frames(n_out, len(str(prompt).split()), chat, bool(opts.get("continuous_usage_stats")),
                     bool(opts.get("include_usage")), fail)
    w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    if itl_s:
        for i, f in enumerate(frames):
            w.write(f)
            await w.drain()
            if i < len(frames) - 1:
                await asyncio.sleep(itl_s)
        return
    for i in range(0, len(frames), 16):  # one write per 16 events, then yield: other streams interleave
        w.write(b"".join(frames[i:i + 16]))
        await w.drain()
        await asyncio.sleep(0)


def _plain(w: asyncio.StreamWriter, status: str, body: bytes, ctype: bytes = b"application/json") -> None:
    w.write(b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (status.encode(), ctype,
                                                                                   len(body), body))


async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, itl_s: float = 0.0, fail_every: int = 0,
                 http_error_every: int = 0) -> None:
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            line, *hdrs = head.decode("latin-1").split("\r\n")
            method, path, _ = line.split(" ", 2)
            length = 0
            for h in hdrs:
                if h.lower().startswith("content-length:"):
                    length = int(h.split(":", 1)[1])
            raw = await r.readexactly(length) if length else b""
            if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                c = Counters
                c.requests += 1
                if http_error_every and c.requests % http_error_every == 0:
                    _plain(w, "500 Internal Server Error", b'{"error": "mock http error"}')
                else:
                    c.inflight += 1
                    c.max_inflight = max(c.max_inflight, c.inflight)
                    if c.barrier:
                        c.released = c.released or asyncio.Event()
                        if c.inflight >= c.barrier:
                            c.released.set()
                        try:
                            await asyncio.wait_for(c.released.wait(), 10.0)
                        except asyncio.TimeoutError:
                            pass
                    try:
                        await _stream(w, json.loads(raw), path.endswith("chat/completions"), itl_s,
                                      bool(fail_every) and c.requests % fail_every == 0)
                    finally:
                        c.inflight -= 1
            elif path == "/metrics":
                text = (f"mock_requests_total {Counters.requests}\nmock_max_inflight {Counters.max_inflight}\n"
                        f"vllm:num_requests_running {Counters.inflight}\n")
                _plain(w, "200 OK", text.encode(), b"text/plain; version=0.0.4")
            elif path == "/v1/models":
                _plain(w, "200 OK", json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
            elif path == "/health":
                _plain(w, "200 OK", b"{}")
            elif path == "/tokenize":
                req = json.loads(raw or b"{}")
                _plain(w, "200 OK", json.dumps({"count": len(str(req.get("prompt", "")).split())}).encode())
            else:
                _plain(w, "404 Not Found", b'{"error": "not found"}')
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()


async def serve(host: str = "127.0.0.1", port: int = 0, itl_ms: float = 0.0, ready=None, fail_every: int = 0,
                http_error_every: int = 0, sock: socket.socket | None = None) -> None:
    h = lambda r, w: handle(r, w, itl_ms / 1e3, fail_every, http_error_every)  # noqa: E731
    srv = await (asyncio.start_server(h, sock=sock, backlog=4096) if sock is not None
                 else asyncio.start_server(h, host, port, backlog=4096))
    if ready is not None:
        ready(srv.sockets[0].getsockname()[1])
    async with srv:
        await srv.serve_forever()


async def _orphan_watch(parent: int) -> None:
    while os.getppid() == parent:  # a forked worker ends with the process that started it
        await asyncio.sleep(0.5)
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--http-error-every", type=int, default=0)
    ap.add_argument("--barrier", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes accepting on one socket (counters are per worker)")
    a = ap.parse_args()
    Counters.barrier = a.barrier
    sock = socket.create_server((a.host, a.port), backlog=4096)
    parent = os.getpid()
    for _ in range(a.workers - 1):
        if os.fork() == 0:
            async def worker():
                asyncio.get_running_loop().create_task(_orphan_watch(parent))
                await serve(sock=sock, itl_ms=a.itl_ms, fail_every=a.fail_every, http_error_every=a.http_error_every)
            asyncio.run(worker())
            os._exit(0)
    asyncio.run(serve(sock=sock, itl_ms=a.itl_ms, ready=lambda p: print(f"PORT {p}", flush=True),
                      fail_every=a.fail_every, http_error_every=a.http_error_every))


if __name__ == "__main__":
    main()
