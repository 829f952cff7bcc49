"""Shared helpers of the service tests (no tests here): small fast goals, tokens, a live server process."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"viewer": "viewer-token-0123456789", "approver": "approver-token-0123456789",
          "admin": "admin-token-0123456789"}
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
        g["authorisation"] = {**g["authorisation"], "hot": "auto", "restart": "auto"}
    return g


def wait_until(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll `pred` until it returns something truthy (waiting on the service's state, not on time)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(tmp: Path, db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_") or k == "TUNELOOP_TEST_PG_URL"}
    env.update({"TUNELOOP_DB": db_url, "TUNELOOP_RUNS_ROOT": str(tmp / "runs"), "TUNELOOP_TOKENS": TOKENS_ENV,
                "TUNELOOP_POLL_S": "0.1", "TUNELOOP_CLAIM_TTL_S": "3", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


class ServerProcess:
    """`tuneloop serve` as a real process on a free port; its output goes to a log file."""

    def __init__(self, tmp: Path, env: dict[str, str], log_name: str = "serve.log"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / log_name
        self.proc = subprocess.Popen([sys.executable, "-m", "tuneloop_cli", "serve", "--port", str(self.port)],
                                     cwd=tmp, env=env | {"PYTHONPATH": str(ROOT)}, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT)
        wait_until(self._up, 60, "the server to answer /health")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
