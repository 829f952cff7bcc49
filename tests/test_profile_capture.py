"""Profile capture on real targets: the engine's torch-profiler trace stays on the target, the analyser
(executor/profilers.py, run there by the target's python) splits device time into compute /
communication / scheduling / idle, and only that summary comes back. The trace files here are
generated in the torch profiler's Chrome-trace format with known answers."""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from executor import profilers
from executor.profilers_capture import profile_window
from executor.targets import Host, Target
from executor.templates import Rendered, ServiceSpec
from executor.transports.local import LocalTransport


def _x(cat: str, name: str, ts: float, dur: float, pid: int = 0) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": 7}


def trace(offset: float = 0.0, pid: int = 0) -> dict:
    """Window 0..300 us on one device: compute 200, exposed allreduce 50 (50 more hidden under compute),
    a 50 us gap of which the host was busy for 30 (scheduling) and idle for 20."""
    o = offset
    return {"traceEvents": [
        _x("kernel", "sm90_xmma_gemm_bf16", o + 0, 100, pid),
        _x("kernel", "flash_fwd_kernel", o + 150, 100, pid),
        _x("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", o + 200, 100, pid),
        _x("cpu_op", "vllm::scheduler::schedule", o + 100, 30, 99),
        _x("cuda_runtime", "cudaLaunchKernel", o + 90, 5, 99),  # during a kernel: no gap to explain
        {"ph": "i", "name": "marker", "ts": o + 10, "pid": 99},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]}


EXPECTED = {"compute": 200e-6, "communication": 50e-6, "scheduling": 30e-6, "idle": 20e-6}


def test_analyser_splits_device_time_and_sums_ranks(tmp_path):
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(trace()))
    with gzip.open(tmp_path / "rank1.pt.trace.json.gz", "wt") as f:
        json.dump(trace(offset=1e6, pid=1), f)
    s = profilers.analyse(str(tmp_path))
    assert s["files"] == 2 and s["devices"] == 2
    for k, v in EXPECTED.items():
        assert s["seconds"][k] == pytest.approx(2 * v), k
    assert sum(s["share"].values()) == pytest.approx(1.0) and s["share"]["compute"] == pytest.approx(200 / 300)
    assert s["top_kernels"][0]["name"] in ("sm90_xmma_gemm_bf16", "flash_fwd_kernel")
    assert profilers.analyse(str(tmp_path / "none"))["files"] == 0


class _Engine(BaseHTTPRequestHandler):
    """An engine's profiler endpoints: /stop_profile writes the trace where the engine was told to."""
    trace_dir: Path
    calls: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.calls.append(self.path)
        if self.path == "/stop_profile":
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            with gzip.open(self.trace_dir / f"host.{time.time_ns()}.pt.trace.json.gz", "wt") as f:
                json.dump(trace(), f)
        self.send_response(200 if self.path in ("/start_profile", "/stop_profile") else 404)
        self.end_headers()

    def log_message(self, *a):  # keep test output quiet
        pass


@pytest.fixture
def engine(tmp_path):
    _Engine.trace_dir = tmp_path / "tgt" / "svc" / "mixed-0" / "trace"
    _Engine.calls = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1], _Engine
    srv.shutdown()


def test_profile_window_analyses_on_the_target_and_brings_back_only_the_summary(tmp_path, engine):
    port, eng = engine
    eng.trace_dir.mkdir(parents=True)
    stale = eng.trace_dir / "old.pt.trace.json"  # an earlier window's trace: must not be counted again
    stale.write_text(json.dumps(trace()))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    target = Target(name="loc", kind="local", engine="vllm", model="m", run_root=str(tmp_path / "tgt"),
                    python=sys.executable, hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), port=port),))
    svc = ServiceSpec(name="mixed-0", role="mixed", host="127.0.0.1", port=port, argv=("vllm",),
                      profile_dir=str(eng.trace_dir))
    rendered = Rendered(services=(svc,), endpoint=f"http://127.0.0.1:{port}", engine="vllm")
    out = asyncio.run(profile_window(LocalTransport(target), rendered, 0.05, sys.executable))
    assert eng.calls == ["/start_profile", "/stop_profile"]
    assert out["start_status"] == {"mixed-0": 200} and out["stop_status"] == {"mixed-0": 200}
    s = out["summary"]
    assert s["files"] == 1, out  # only the trace written during this window
    for k, v in EXPECTED.items():
        assert s["seconds"][k] == pytest.approx(v), k
    assert "traceEvents" not in json.dumps(out)  # no trace content travels back
    assert len(list(eng.trace_dir.glob("*.gz"))) == 1  # the trace stays on the target
    assert json.loads(Path(f"{eng.trace_dir}.summary.json").read_text())["files"] == 1


def test_templates_point_the_profiler_at_the_service_directory():
    from core.station import Station
    from executor.templates import render

    t = Target(name="g", kind="ssh", engine="vllm", model="/m", run_root="/srv/tl", ssh={"known_hosts": "/kh"},
               hosts=(Host(host="h1", roles=("mixed", "load"), cards=8),))
    st = Station(engine="vllm", knobs={}, scenario="s", data_version="d", source_identity="x", target="g")
    (svc,) = render(t, st).services
    # vLLM 0.32 mounts /start_profile only with --profiler-config (VLLM_TORCH_PROFILER_DIR is no longer read)
    conf = json.loads(svc.argv[svc.argv.index("--profiler-config") + 1])
    assert svc.profile_dir == "/srv/tl/svc/mixed-0/trace" == conf["torch_profiler_dir"] and conf["profiler"] == "torch"
    assert "VLLM_TORCH_PROFILER_DIR" not in svc.env
    assert svc.env["VLLM_SERVER_DEV_MODE"] == "1"  # mounts /reset_prefix_cache for the zero-cache flush
    sg = render(t.model_copy(update={"engine": "sglang"}), st.model_copy(update={"engine": "sglang"})).services[0]
    assert sg.env["SGLANG_TORCH_PROFILER_DIR"] == sg.profile_dir == "/srv/tl/svc/mixed-0/trace"
