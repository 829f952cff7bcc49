"""The prefix-cache flush each engine understands, against a real HTTP server speaking each engine's
endpoints: vLLM / sim `POST /reset_prefix_cache`, SGLang `POST /flush_cache`, llama.cpp erasing every
slot; an engine that refuses (or has no endpoint) reports ok=False so the runner restarts it."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from executor.cacheflush import cache_holders, flush_service
from executor.targets import Host, Target
from executor.templates import ServiceSpec
from executor.transports.local import LocalTransport


class _Engine(BaseHTTPRequestHandler):
    calls: list[str] = []
    refuse = False
    held = False  # vLLM answers 200 {"success": false} while blocks are held

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.calls.append(f"GET {self.path}")
        if self.path == "/slots":
            self._reply(200, json.dumps([{"id": 0}, {"id": 1}, {"id": 2}]).encode())
        else:
            self._reply(404)

    def do_POST(self):  # noqa: N802
        self.calls.append(f"POST {self.path}")
        known = self.path in ("/reset_prefix_cache", "/flush_cache") or self.path.endswith("?action=erase")
        body = json.dumps({"success": not self.held}).encode() if self.path == "/reset_prefix_cache" else b""
        self._reply(404 if self.refuse or not known else 200, body)

    def log_message(self, *a):
        pass


@pytest.fixture
def engine():
    _Engine.calls, _Engine.refuse, _Engine.held = [], False, False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    t = Target(name="loc", kind="local", engine="vllm", model="m", hosts=(Host(host="127.0.0.1", roles=("mixed", "load")),))
    svc = ServiceSpec(name="mixed-0", role="mixed", host="127.0.0.1", port=port, argv=("x",))
    yield LocalTransport(t), svc
    srv.shutdown()


@pytest.mark.parametrize("engine_name,call", [("vllm", "POST /reset_prefix_cache"), ("sim", "POST /reset_prefix_cache"),
                                              ("sglang", "POST /flush_cache")])
def test_one_request_flushes(engine, engine_name, call):
    tr, svc = engine
    out = asyncio.run(flush_service(tr, svc, engine_name))
    assert out["ok"] and _Engine.calls == [call]


@pytest.mark.parametrize("engine_name", ["vllm", "vllm-ascend", "sim"])
def test_a_200_that_says_success_false_is_not_a_flush(engine, engine_name):
    tr, svc = engine
    _Engine.held = True
    out = asyncio.run(flush_service(tr, svc, engine_name))
    assert out["status"] == 200 and out["ok"] is False  # the runner restarts the service instead


def test_llama_cpp_erases_every_slot_and_counts_it_a_flush_only_without_the_ram_prompt_cache(engine):
    tr, svc = engine
    off = svc.model_copy(update={"argv": ("llama-server", "--cache-ram", "0")})
    out = asyncio.run(flush_service(tr, off, "llamacpp"))
    assert out["ok"] and out["slots"] == 3
    assert _Engine.calls == ["GET /slots"] + [f"POST /slots/{i}?action=erase" for i in range(3)]
    # the host-RAM prompt cache (on by default) keeps prompts that slot erase does not touch: restart instead
    for on in (svc, svc.model_copy(update={"argv": ("llama-server", "-cram", "0", "--cache-ram", "512")})):
        out = asyncio.run(flush_service(tr, on, "llamacpp"))
        assert out["slots"] == 3 and out["ok"] is False and "--cache-ram" in out["held"]
    env = svc.model_copy(update={"env": {"LLAMA_ARG_CACHE_RAM": "0"}})
    assert asyncio.run(flush_service(tr, env, "llamacpp"))["ok"]


def test_refusal_or_no_endpoint_is_not_ok(engine):
    tr, svc = engine
    _Engine.refuse = True  # e.g. vLLM started without VLLM_SERVER_DEV_MODE: the route is not mounted
    assert asyncio.run(flush_service(tr, svc, "vllm")) | {"service": None} == {
        "service": None, "method": "POST /reset_prefix_cache", "status": 404, "ok": False}
    assert asyncio.run(flush_service(tr, svc, "mindie"))["ok"] is False  # no flush endpoint: restart instead


def test_routers_hold_no_cache():
    a = ServiceSpec(name="prefill-0", role="prefill", host="h", port=1, argv=("x",))
    r = ServiceSpec(name="router-0", role="router", host="h", port=2, argv=("x",))
    assert cache_holders((a, r)) == [a]
