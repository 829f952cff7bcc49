"""Shared helpers of the service tests (no tests here): small fast goals, tokens, a live server process."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml
from ports_support import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"viewer": "viewer-token-0123456789", "approver": "approver-token-0123456789",
          "admin": "admin-token-0123456789"}
# bounds, not expectations: generous so a loaded 2-core machine cannot make a waiting test flake
STARTUP_S = 300.0  # a process importing the whole stack under load
PROGRESS_S = 300.0  # a few simulated experiments
TOKENS_ENV = ",".join(f"{r}1:{r}:{t}" for r, t in TOKENS.items())


def auth(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def small_goal(name: str = "svc-goal", *, target: str = "sim", ask: bool = True, experiments: int = 2,
               n: int = 40) -> dict[str, Any]:
    """The 16K goal cut down to a few short experiments (about a second each on the simulator)."""
    g = yaml.safe_load((ROOT / "examples" / "goal-16k.yaml").read_text())
    g["name"], g["target"] = name, target
    g["constraints"].pop("cards", None)
    g["protocol"] = {"screen_n": n, "confirm_n": n + 20, "warmup": 0, "native_min_requests": 16,
                     "native_min_seconds": 5, "seeds": [0]}
    g["budget"] = {"card_hours": 24, "experiments": experiments}
    if ask:
        g["authorisation"] = {**g["authorisation"], "hot": "ask", "restart": "ask"}
    else:
        # a goal that never waits for a person on a card: the goal's twin (on by default) jumps to a station with the
        # index-cache reuse, a quality-risk change, which the 16K goal asks a person for
        g["authorisation"] = {**g["authorisation"], "hot": "auto", "restart": "auto", "quality_risk": "auto"}
    return g


def wait_until(pred: Callable[[], Any], timeout: float = PROGRESS_S, what: str = "condition") -> Any:
    """Poll `pred` until it returns something truthy (waiting on the service's state, not on time); the
    timeout only bounds a hang."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def service_env(tmp: Path, db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TUNELOOP_") or k in ("TUNELOOP_TEST_PG_URL", "TUNELOOP_TWIN_CACHE")}
    env.update({"TUNELOOP_DB": db_url, "TUNELOOP_RUNS_ROOT": str(tmp / "runs"), "TUNELOOP_TOKENS": TOKENS_ENV,
                "TUNELOOP_POLL_S": "0.1", "TUNELOOP_CLAIM_TTL_S": "3", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


class ProcessOutput:
    """A child process whose output is copied line by line to a log file by a reader thread; tests wait on a
    line (an event: the process said so), not on time. A wait fails at once, with the log, if the process exits."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path):
        self.log = log
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "a", encoding="utf-8") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                with self.cond:
                    self.lines.append(line)
                    self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()  # end of output: the process is gone

    def wait_for(self, pattern: str, timeout: float = STARTUP_S) -> str:
        rx = re.compile(pattern)
        with self.cond:
            ok = self.cond.wait_for(lambda: any(rx.search(x) for x in self.lines) or not self._reader.is_alive(),
                                    timeout)
            hit = next((x for x in self.lines if rx.search(x)), None)
        if hit is None:
            why = f"exited {self.proc.poll()}" if self.proc.poll() is not None else f"no such line in {timeout:.0f} s"
            raise AssertionError(f"{' '.join(self.proc.args[2:4])} {why} waiting for /{pattern}/; output:\n"
                                 + "".join(self.lines)[-3000:])
        assert ok
        return hit

    def text(self) -> str:
        with self.cond:
            return "".join(self.lines)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)


class ServerProcess(ProcessOutput):
    """`tuneloop serve` as a real process on a free port; ready once uvicorn says it listens."""

    def __init__(self, tmp: Path, env: dict[str, str], log_name: str = "serve.log"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([sys.executable, "-m", "tuneloop_cli", "serve", "--port", str(self.port)], tmp, env,
                         tmp / log_name)
        self.wait_for(r"Uvicorn running on")  # uvicorn says so after the app's startup (store open, workers up)
        assert httpx.get(self.url + "/health", timeout=30).status_code == 200


def worker_process(tmp: Path, env: dict[str, str], name: str, *targets: str) -> ProcessOutput:
    """`tuneloop worker --name NAME --target T...`; returns once it says it claims goals."""
    argv = [sys.executable, "-m", "tuneloop_cli", "worker", "--name", name]
    for t in targets:
        argv += ["--target", t]
    return ProcessOutput(argv, tmp, env, tmp / f"{name}.log")


# -- a local HTTP server standing in for a remote API (an LLM endpoint, Slack, Feishu) ---------------------------
def reply(h: BaseHTTPRequestHandler, code: int, data: bytes, content_type: str = "application/json") -> None:
    """Answer the request `h` handles with `data`."""
    h.send_response(code)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """`handler` on a free port of 127.0.0.1, served by a daemon thread; `shutdown()` and `server_close()` end it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
