"""The load generator's own ceiling, against a streaming server that adds no delay (executor.mockserver).

Prints, from one client process: requests/s and streamed tokens/s at rate=inf; then the client
queue delay p50/p99 (t_send - t_sched) at 50 req/s with C=256 and 1024-token outputs.
With --procs K the same load is split over K client processes (C/K slots and r/K each, interleaved
schedules), and the figures are computed over the merged raw records.

    .venv/bin/python bench/client_ceiling.py [--n 512] [--rate-n 500] [--procs 1] [--server-procs 1]
"""
from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor import records as rec  # noqa: E402
from executor.loadgen import LoadConfig, ScenarioPrompts, run_load  # noqa: E402
from simulator.scenarios import Scenario  # noqa: E402

SCENARIO = Scenario(name="ceiling", version=1, task="chat", input_len=32, output_len=1024)


def start_servers(k: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(k):
        p = subprocess.Popen([sys.executable, "-m", "executor.mockserver", "--port", "0"],
                             cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        procs.append(p)
        urls.append(f"http://127.0.0.1:{int(line.split()[1])}")
    return procs, urls


def one_client(url: str, n: int, c: int, rate: float, offset_s: float, run_dir: str, start_at: float) -> None:
    """One client process; waits for the common start instant so K processes start together."""
    prompts = ScenarioPrompts(SCENARIO, n, 0)
    cfg = LoadConfig(endpoint=url, n=n, concurrency=c, request_rate=rate, model="mock", continuous_usage=False)
    info = rec.RunInfo(scenario="ceiling", scenario_version=1, n=n, concurrency=c, request_rate=rate, output_len=1024)
    while time.time() < start_at:
        time.sleep(0.001)
    if offset_s:
        time.sleep(offset_s)
    asyncio.run(run_load(cfg, prompts, Path(run_dir), info))


def load(urls: list[str], n: int, c: int, rate: float, procs: int) -> tuple[list, float]:
    tmp = Path(tempfile.mkdtemp(prefix="ceiling-"))
    start_at = time.time() + 1.0
    jobs = []
    for i in range(procs):
        gap = 0.0 if math.isinf(rate) else i / rate  # interleave: process i sends at (j*K + i)/r
        jobs.append(mp.Process(target=one_client, args=(urls[i % len(urls)], n // procs, c // procs,
                                                        rate / procs, gap, str(tmp / f"p{i}"), start_at)))
    t = time.perf_counter()
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    wall = time.perf_counter() - t - 1.0
    return [list(rec.read_jsonl(tmp / f"p{i}" / rec.REQUESTS, rec.RequestRecord)) for i in range(procs)], wall


def report(title: str, per_proc: list[list], procs: int) -> None:
    """Processes start at one instant; each has its own clock origin, so the window is the longest span."""
    recs = [r for g in per_proc for r in g]
    ok = [r for r in recs if r.ok]
    spans = [max(r.t_last for r in g if r.ok) - min(r.t_send for r in g if r.ok) for g in per_proc if g]
    span = max(spans)
    toks = sum(r.n_out or 0 for r in ok)
    qd = np.array([(r.t_send - r.t_sched) * 1e3 for r in recs if r.t_send is not None])
    print(f"{title}: {len(ok)}/{len(recs)} ok, window {span:.2f} s, {len(ok) / span:.1f} req/s, "
          f"{toks / span:,.0f} streamed tok/s, queue delay p50 {np.percentile(qd, 50):.2f} ms "
          f"p99 {np.percentile(qd, 99):.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--rate-n", type=int, default=500)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--server-procs", type=int, default=1)
    a = ap.parse_args()
    servers, urls = start_servers(a.server_procs)
    try:
        print(f"client processes: {a.procs}; mock server processes: {a.server_procs}; outputs 1024 tokens")
        per, _ = load(urls, a.n, 256, math.inf, a.procs)
        report(f"ceiling  C=256 r=inf N={a.n}", per, a.procs)
        per, _ = load(urls, a.rate_n, 256, 50.0, a.procs)
        report(f"paced    C=256 r=50  N={a.rate_n}", per, a.procs)
    finally:
        for p in servers:
            p.kill()


if __name__ == "__main__":
    main()
