"""The service under a dashboard's load: `tuneloop serve` as a process, a goal running on the simulator, and N GETs
at concurrency C over the dashboard's routes (keep-alive clients, as browsers poll).

Routes in turn: /goals, /goals/G, /goals/G/candidates, /goals/G/decisions, /goals/G/experiments, /health, /metrics.
Prints req/s, p50 and p99 latency, errors (non-200 answers and connection errors), whether the goal ran throughout,
and the load average (the machine may be shared). --runs K repeats the measurement on the same server and prints
the median of each figure.

    .venv/bin/python bench/api_load.py [--n 3000] [--c 50] [--runs 3] [--idle] [--serve-arg=--in-process]
    [--root DIR]  serve the code of another checkout (e.g. an export of an older commit) for a before/after ratio
Target (issue 18): 3000 GETs at C=50 while a goal runs: 0 errors, >= 300 req/s, p99 < 250 ms (2-core machine).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-viewer-token-0123456789"
ADMIN = "bench-admin-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def long_goal(experiments: int) -> dict:
    """The 16K example goal on the simulator, every card automatic, enough experiments to outlast the load."""
    g = yaml.safe_load((ROOT / "examples" / "goal-16k.yaml").read_text())
    g["name"], g["target"] = "bench-load", "sim"
    g["constraints"].pop("cards", None)
    g["protocol"] = {"screen_n": 200, "confirm_n": 300, "warmup": 0, "native_min_requests": 16,
                     "native_min_seconds": 5, "seeds": [0]}
    g["budget"] = {"card_hours": 500, "experiments": experiments}
    g["authorisation"] = {**g["authorisation"], "hot": "auto", "restart": "auto"}
    return g


def decisions_now(url: str, h: dict) -> int:
    """Decisions of every goal so far (the goal running during the load may be the second or third)."""
    with httpx.Client(headers=h, timeout=60) as c:
        return sum(len(c.get(f"{url}/goals/{g['id']}/decisions").json()) for g in c.get(f"{url}/goals").json())


def keep_running(url: str, h: dict, gid: str, experiments: int, stop: threading.Event) -> None:
    with httpx.Client(headers=h, timeout=60) as c:
        i = 0
        while not stop.wait(0.5):
            if c.get(f"{url}/goals/{gid}").json()["status"] in ("done", "stopped"):
                i += 1
                g = long_goal(experiments) | {"name": f"bench-load-{i}"}
                gid = c.post(f"{url}/goals", json=g).json()["id"]


def start(root: Path, tmp: Path, serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    env.update({"TUNELOOP_DB": f"sqlite:///{tmp / 'bench.db'}", "TUNELOOP_RUNS_ROOT": str(tmp / "runs"),
                "TUNELOOP_TOKENS": f"viewer1:viewer:{TOKEN},admin1:admin:{ADMIN}", "PYTHONPATH": str(root)})
    p = subprocess.Popen([sys.executable, "-m", "tuneloop_cli", "serve", "--port", str(port), *serve_args], cwd=tmp,
                         env=env, stdout=open(tmp / "serve.log", "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"serve exited {p.returncode}:\n{(tmp / 'serve.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("serve did not answer /health")


async def drive(url: str, paths: list[str], n: int, c: int) -> dict:
    lat: list[float] = []
    errors: dict[str, int] = {}
    nxt = 0
    conn = aiohttp.TCPConnector(limit=c, force_close=False)
    async with aiohttp.ClientSession(url, connector=conn, headers={"Authorization": f"Bearer {TOKEN}"},
                                     timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def client() -> None:
            nonlocal nxt
            while nxt < n:
                path = paths[nxt % len(paths)]
                nxt += 1
                t0 = time.perf_counter()
                try:
                    async with s.get(path) as r:
                        await r.read()
                        if r.status != 200:
                            errors[f"HTTP {r.status}"] = errors.get(f"HTTP {r.status}", 0) + 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(c)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"rps": n / wall, "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
            "errors": sum(errors.values()), "kinds": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--c", type=int, default=50)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--idle", action="store_true", help="no goal runs during the load")
    ap.add_argument("--experiments", type=int, default=60, help="the running goal's experiment budget")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose tuneloop is served")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument of `tuneloop serve`")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="api-load-") as d:
        tmp = Path(d)
        proc, url = start(a.root.resolve(), tmp, a.serve_arg)
        try:
            h = {"Authorization": f"Bearer {ADMIN}"}
            print(f"api pid {httpx.get(url + '/health', timeout=60).json().get('pid')}", flush=True)
            gid = httpx.post(f"{url}/goals", json=long_goal(a.experiments), headers=h, timeout=60).json()["id"]
            keep = threading.Event()
            if not a.idle:  # a goal runs throughout: when one ends, the next one (another name) is posted
                threading.Thread(target=keep_running, args=(url, h, gid, a.experiments, keep), daemon=True).start()
            # the dashboard's routes; wait until the goal has run an experiment so the lists are not empty
            deadline = time.monotonic() + 300
            while not httpx.get(f"{url}/goals/{gid}/experiments", headers=h, timeout=60).json():
                if time.monotonic() > deadline:
                    raise SystemExit("the goal never ran an experiment")
                time.sleep(0.2)
            if a.idle:
                httpx.post(f"{url}/goals/{gid}/stop", headers=h, timeout=60)
                while httpx.get(f"{url}/goals/{gid}", headers=h, timeout=60).json()["worker_state"] == "claimed":
                    time.sleep(0.2)
            paths = ["/goals", f"/goals/{gid}", f"/goals/{gid}/candidates", f"/goals/{gid}/decisions",
                     f"/goals/{gid}/experiments", "/health", "/metrics"]
            results = []
            for i in range(a.runs):
                before = decisions_now(url, h)
                r = asyncio.run(drive(url, paths, a.n, a.c))
                g = httpx.get(f"{url}/goals/{gid}", headers=h, timeout=60).json()
                r["decisions_during"] = decisions_now(url, h) - before
                r["goal_after"] = f"{g['status']}/{g['worker_state']}"
                r["goals"] = len(httpx.get(f"{url}/goals", headers=h, timeout=60).json())
                r["load1"] = os.getloadavg()[0]
                results.append(r)
                print(f"run {i + 1}: {r['rps']:.0f} req/s  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
                      f"errors {r['errors']} {r['kinds'] or ''}  decisions during the load {r['decisions_during']}"
                      f"  goal after: {r['goal_after']} ({r['goals']} goals)  load average {r['load1']:.2f}", flush=True)
            med = {k: statistics.median(r[k] for r in results) for k in ("rps", "p50_ms", "p99_ms", "errors", "load1")}
            print(f"median of {a.runs} ({'idle' if a.idle else 'goal running'}, N={a.n}, C={a.c}): "
                  f"{med['rps']:.0f} req/s  p50 {med['p50_ms']:.1f} ms  p99 {med['p99_ms']:.1f} ms  "
                  f"errors {med['errors']:.0f}  load average {med['load1']:.2f}")
        finally:
            keep.set()
            os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


if __name__ == "__main__":
    main()
