"""`tuneloop serve`'s processes: an API process and a worker process, supervised.

The supervisor binds the listening socket itself (with `backlog`) and hands it to the API process, so the loop's
CPU (the simulator, a report) never holds a request up, and while a killed API process is restarted new
connections wait in the kernel's queue instead of being refused. The worker process is `tuneloop worker`
(`workers` threads); the two share the store (SQLite in WAL mode or PostgreSQL) and nothing else: a person's
action marks the goal ready in the work queue and the worker claims it at its next poll (`poll_s`).
Either process that exits is started again (after 0.5 s, doubling up to 30 s while it keeps dying young); the
other one goes on. SIGTERM / SIGINT stop both; the children die with the supervisor (PR_SET_PDEATHSIG) when it
is killed outright.

    python -m api.supervisor api --fd N --host H --port P   (the API process; started by the supervisor)
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from api.app import create_app
from api.logfilter import install, uvicorn_log_config
from api.settings import Settings

log = logging.getLogger("tuneloop.serve")
PR_SET_PDEATHSIG = 1
FIRST_DELAY_S, MAX_DELAY_S, YOUNG_S = 0.5, 30.0, 10.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the children outlive a supervisor killed with SIGKILL
        pass


def child_env(settings: Settings) -> dict[str, str]:
    """The environment of both children: the settings the command line changed, as their variables."""
    env = dict(os.environ)
    env.update({"TUNELOOP_DB": settings.db_url, "TUNELOOP_WORKERS": str(settings.workers),
                "TUNELOOP_SUPERVISED": "1", "PYTHONUNBUFFERED": "1"})
    if settings.targets_file is not None:
        env["TUNELOOP_TARGETS"] = str(settings.targets_file)
    if settings.data_dirs:
        env["TUNELOOP_DATA_DIRS"] = os.pathsep.join(str(d) for d in settings.data_dirs)
    return env


class Child:
    def __init__(self, name: str, start: Callable[[], subprocess.Popen]):
        self.name, self.start = name, start
        self.proc = start()
        self.started = time.monotonic()
        self.delay = FIRST_DELAY_S
        self.due: float | None = None  # when a dead child is started again
        log.info("%s process started (pid %d)", name, self.proc.pid)

    def check(self, now: float) -> None:
        if self.due is None:
            rc = self.proc.poll()
            if rc is None:
                return
            why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
            self.delay = FIRST_DELAY_S if now - self.started > YOUNG_S else min(self.delay * 2, MAX_DELAY_S)
            self.due = now + self.delay
            log.warning("%s process %d ended (%s); starting it again in %.1f s", self.name, self.proc.pid, why,
                        self.delay)
        elif now >= self.due:
            self.proc, self.started, self.due = self.start(), now, None
            log.info("%s process started again (pid %d)", self.name, self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def supervise(settings: Settings, host: str, port: int) -> None:
    sock = socket.create_server((host, port), backlog=settings.backlog)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    env = child_env(settings)
    fd = sock.fileno()

    def api() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "api.supervisor", "api", "--fd", str(fd), "--host", host,
                                 "--port", str(port)], env=env, pass_fds=(fd,), preexec_fn=_die_with_parent)

    def worker() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tuneloop_cli", "worker", "--count", str(settings.workers)],
                                env=env, preexec_fn=_die_with_parent)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    children = [Child("api", api)] + ([Child("worker", worker)] if settings.workers > 0 else [])
    log.info("tuneloop serve on %s:%d: api process + %s (store %s)", host, port,
             f"worker process x{settings.workers}" if settings.workers else "no worker process",
             settings.db_url.split(":", 1)[0])
    try:
        while not stop.wait(0.2):
            now = time.monotonic()
            for c in children:
                c.check(now)
    finally:
        for c in children:
            c.stop()
        for c in children:
            c.wait(30)
        sock.close()


def api_process(fd: int, host: str, port: int) -> None:
    """The API process: the app without workers, serving the supervisor's socket."""
    import uvicorn  # deferred: uvicorn

    settings = Settings.from_env()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install(settings.secrets)
    config = uvicorn.Config(create_app(settings, start_workers=False), host=host, port=port, log_level="info",
                            log_config=uvicorn_log_config(settings.secrets), **server_options(settings))
    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:  # uvicorn says so itself only for a socket it bound
                logging.getLogger("uvicorn.error").info("Uvicorn running on http://%s:%d (pid %d)", host, port,
                                                        os.getpid())

    Server(config).run(sockets=[socket.socket(fileno=fd)])


def server_options(settings: Settings) -> dict[str, object]:
    """uvicorn's settings for the API (docs/serving.md): idle keep-alive connections kept longer than clients
    keep theirs (a server closing one just as the client reuses it is a reset connection) and the listen
    backlog; the HTTP parser and event loop are httptools and uvloop (uvicorn picks them when installed)."""
    return {"timeout_keep_alive": int(settings.keepalive_s), "backlog": settings.backlog}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m api.supervisor")
    ap.add_argument("role", choices=["api"])
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    api_process(a.fd, a.host, a.port)


if __name__ == "__main__":
    main()
