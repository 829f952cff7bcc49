"""The load generator's own ceiling, against a streaming server that adds no delay (executor.mockserver).

From ONE client process (executor.loadgen.run_load, as `tuneloop load run` uses it), or with --procs K
from K processes sharing one arrival schedule and one budget of C credits (executor.loadgen.run_procs):
  * ceiling: requests/s and streamed tokens/s at rate=inf, C=256, 1024-token outputs;
  * paced: client queue delay (t_send - t_sched) p50/p99 at 50 req/s, C=256, 1024-token outputs.
Each is repeated --repeats times in this one invocation and the medians are printed, with the load
average (the machine is shared) and the CPU each side spent per token: the mock server runs in its own
process(es) (--server-workers forks that share one socket) and pre-encodes its chunks, so the server's
figure shows it is not the bottleneck.

    .venv/bin/python bench/client_ceiling.py [--n 512] [--rate-n 500] [--repeats 3] [--server-workers 1]
Target (issue 3): >= 30 000 streamed tok/s from one process, p99 queue delay < 10 ms at 50 req/s.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core import records as rec  # noqa: E402
from core.scenarios import Scenario  # noqa: E402
from executor.loadgen import LoadConfig, ScenarioPrompts, run_load, run_procs  # noqa: E402

SCENARIO = Scenario(name="ceiling", version=1, task="chat", input_len=32, output_len=1024)
TICK = os.sysconf("SC_CLK_TCK")


def start_server(workers: int) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "executor.mockserver", "--port", "0", "--workers", str(workers)],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    return p, f"http://127.0.0.1:{int(p.stdout.readline().split()[1])}"


def group_cpu_s(pgid: int) -> float:
    """user+system CPU seconds of every process in the server's process group (its forked workers too)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid:
            total += int(f[11]) + int(f[12])
    return total / TICK


def one_run(url: str, pgid: int, n: int, c: int, rate: float, procs: int = 1) -> dict:
    prompts = ScenarioPrompts(SCENARIO, n, 0)
    cfg = LoadConfig(endpoint=url, n=n, concurrency=c, request_rate=rate, model="mock", continuous_usage=False)
    info = rec.RunInfo(scenario="ceiling", scenario_version=1, n=n, concurrency=c, request_rate=rate, output_len=1024)
    out = Path(tempfile.mkdtemp(prefix="ceiling-"))
    own = lambda: sum(os.times()[:4])  # noqa: E731  this process + its joined children (the --procs clients)
    s0, c0 = group_cpu_s(pgid), own()
    if procs > 1:  # K processes, one shared schedule and one shared budget of C credits
        run_procs(cfg, SCENARIO, out, info, procs)
    else:
        asyncio.run(run_load(cfg, prompts, out, info))
    client_cpu, server_cpu = own() - c0, group_cpu_s(pgid) - s0
    recs = list(rec.read_jsonl(out / rec.REQUESTS, rec.RequestRecord))
    ok = [r for r in recs if r.ok]
    span = max(r.t_last for r in ok) - min(r.t_send for r in ok)
    toks = sum(r.n_out or 0 for r in ok)
    qd = np.array([(r.t_send - r.t_sched) * 1e3 for r in recs])
    return {"ok": len(ok), "n": len(recs), "span": span, "req_s": len(ok) / span, "tok_s": toks / span,
            "qd_p50": float(np.percentile(qd, 50)), "qd_p99": float(np.percentile(qd, 99)),
            "client_us_tok": client_cpu / max(toks, 1) * 1e6, "server_us_tok": server_cpu / max(toks, 1) * 1e6}


def line(title: str, m: dict) -> str:
    return (f"{title}: {m['ok']}/{m['n']} ok, {m['span']:.2f} s, {m['req_s']:.1f} req/s, {m['tok_s']:,.0f} streamed "
            f"tok/s, queue delay p50 {m['qd_p50']:.2f} ms p99 {m['qd_p99']:.2f} ms; CPU/token client "
            f"{m['client_us_tok']:.2f} us, server {m['server_us_tok']:.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--rate-n", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-workers", type=int, default=1)
    ap.add_argument("--procs", type=int, default=1, help="client processes sharing one schedule and one budget")
    a = ap.parse_args()
    server, url = start_server(a.server_workers)
    runs: dict[str, list[dict]] = {"ceiling": [], "paced": []}
    try:
        print(f"{a.procs} client process(es); mock server: {a.server_workers} worker process(es); outputs 1024 tokens; "
              f"{os.cpu_count()} cores; load average before {os.getloadavg()[0]:.2f}", flush=True)
        for i in range(a.repeats):
            runs["ceiling"].append(one_run(url, server.pid, a.n, 256, math.inf, a.procs))
            print(line(f"[{i + 1}] ceiling C=256 r=inf N={a.n}", runs["ceiling"][-1]), flush=True)
            runs["paced"].append(one_run(url, server.pid, a.rate_n, 256, 50.0, a.procs))
            print(line(f"[{i + 1}] paced   C=256 r=50  N={a.rate_n}", runs["paced"][-1]), flush=True)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    med = {k: {f: statistics.median(m[f] for m in v) for f in v[0]} for k, v in runs.items()}
    print(f"median of {a.repeats}: ceiling {med['ceiling']['req_s']:.1f} req/s, {med['ceiling']['tok_s']:,.0f} "
          f"streamed tok/s (client {med['ceiling']['client_us_tok']:.2f} us/token); paced 50 req/s: "
          f"{med['paced']['req_s']:.1f} req/s, queue delay p50 {med['paced']['qd_p50']:.2f} ms "
          f"p99 {med['paced']['qd_p99']:.2f} ms")
    print(f"target: >= 30 000 tok/s: {'met' if med['ceiling']['tok_s'] >= 30000 else 'NOT met'}; "
          f"p99 queue delay < 10 ms: {'met' if med['paced']['qd_p99'] < 10 else 'NOT met'}; "
          f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
