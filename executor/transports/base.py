"""The one small interface every target speaks, and the launcher-driven half shared by local and ssh.

Errors, as a tree:

    TransportError
     ├── Transient          connection lost / timed out: safe to retry a repeatable step
     ├── StaleLaunch        the target's launcher refused our epoch (a newer lease holder exists)
     ├── AlreadyClaimed     the run directory exists: this run was launched before (never launch twice)
     └── LaunchFailed       a service could not start; carries the server's own error text
"""
from __future__ import annotations

import abc
import asyncio
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from pydantic import BaseModel, ConfigDict, Field

from executor.cacheflush import cache_holders, flush_service
from executor.costs import charges
from executor.engines import adapter
from executor.identity import probe_service, source_identity
from executor.launcher import (
    ALREADY_CLAIMED_RC,
    SCRIPT,
    STALE_EPOCH_RC,
    parse_kv,
    script_name,
)
from executor.phases import PhaseFailure
from executor.profilers_capture import profile_window
from executor.targets import Target
from executor.templates import ServiceSpec, svc_dir


HEALTH_PROBE_S = 2.0  # one health request's timeout
PROBE_S = 2 * HEALTH_PROBE_S  # one round of a start-up poll: the service's state, then its health route


class TransportError(Exception):
    pass


class Transient(TransportError):
    pass


class StaleLaunch(TransportError):
    pass


class AlreadyClaimed(TransportError):
    pass


class LaunchFailed(TransportError):
    pass


class CommandResult(NamedTuple):
    rc: int | None  # None: the channel was lost, which is not success
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Markers:
    claimed: bool
    pid: int | None = None
    alive: bool = False
    rc: int | None = None
    done: bool = False
    epoch: int | None = None


@dataclass(frozen=True)
class ServiceState:
    station: str | None
    pid: int | None
    alive: bool
    rc: int | None


class LoadPlan(BaseModel):
    """Everything one load run needs, whichever transport runs it."""

    model_config = ConfigDict(frozen=True)
    endpoint: str
    scenario: str
    n: int
    warmup: int = 0
    concurrency: int
    request_rate: float
    arrival: str = "constant"
    burstiness: float = 1.0
    seed: int = 0
    knobs: dict[str, Any] = Field(default_factory=dict)  # full station (the sim target simulates with it)
    faults: tuple[str, ...] = ()
    metrics: dict[str, str] = Field(default_factory=dict)
    cards: int = 1


def _int(v: str | None) -> int | None:
    return int(v) if v not in (None, "", "-") else None


class LauncherTransport(abc.ABC):
    """Local and SSH targets: every side effect goes through the target-side launcher script."""

    def __init__(self, target: Target):
        self.target = target
        self.root = target.root_for(None)  # the load host's: loads, their markers, launch.log
        self._hosts_ready: set[str | None] = set()

    # -- what a concrete transport supplies ---------------------------------------------------
    @abc.abstractmethod
    async def run(self, argv: list[str], timeout: float = 60.0, host: str | None = None) -> CommandResult: ...

    @abc.abstractmethod
    async def put_text(self, path: str, text: str, mode: int = 0o644, host: str | None = None) -> None: ...

    @abc.abstractmethod
    async def fetch_dir(self, remote: str, local: Path) -> None: ...

    async def close(self) -> None:
        return None

    # -- the shared interface -----------------------------------------------------------------
    def root_for(self, host: str | None) -> str:
        return self.target.root_for(host)

    def script_for(self, host: str | None) -> str:
        return f"{self.root_for(host)}/{script_name()}"

    async def setup(self, host: str | None = None) -> None:
        """Install the launcher on a host (content-hashed name, so an existing copy is the same script)."""
        if host in self._hosts_ready:
            return
        script = self.script_for(host)
        res = await self.run(["test", "-f", script], host=host)
        if res.rc != 0:
            await self.run(["mkdir", "-p", self.root_for(host)], host=host)
            await self.put_text(script, SCRIPT, 0o755, host=host)
        self._hosts_ready.add(host)

    async def _launcher(self, epoch: int, action: str, *args: str, timeout: float = 60.0,
                        host: str | None = None) -> CommandResult:
        await self.setup(host)
        res = await self.run(["sh", self.script_for(host), self.root_for(host), str(epoch), action, *args],
                             timeout=timeout, host=host)
        if res.rc is None:
            raise Transient(f"launcher {action}: connection lost before an exit status came back")
        if res.rc == STALE_EPOCH_RC:
            raise StaleLaunch(res.stderr.strip())
        if res.rc == ALREADY_CLAIMED_RC:
            raise AlreadyClaimed(res.stderr.strip())
        if res.rc != 0:
            raise TransportError(f"launcher {action} failed (rc={res.rc}): {res.stderr.strip()[-2000:]}")
        return res

    async def fence(self, epoch: int) -> None:
        """Every host learns the new epoch, so a stale holder is refused on each of them."""
        hosts: list[str | None] = [None] + sorted({h.host for h in self.target.hosts} - {self._load_host()})
        for host in hosts:
            await self._launcher(epoch, "fence", host=host)

    def _load_host(self) -> str | None:
        h = self.target.host_entry(None)
        return h.host if h else None

    async def start_service(self, svc: ServiceSpec, station: str, epoch: int) -> None:
        d = svc_dir(self.target, svc.name, svc.host)
        if svc.files:
            await self.run(["mkdir", "-p", d], host=svc.host)
            for name, text in svc.files.items():
                await self.put_text(f"{d}/{name}", text, svc.file_modes.get(name, 0o644), host=svc.host)
        env = [f"{k}={v}" for k, v in sorted(svc.env.items())]
        argv = (["env", *env] if env else []) + list(svc.argv)
        await self._launcher(epoch, "service", svc.name, station, "--", *argv, host=svc.host)

    async def stop_service(self, svc: ServiceSpec, epoch: int) -> None:
        await self._launcher(epoch, "stop", svc.name, timeout=120.0, host=svc.host)

    async def service_state(self, svc: ServiceSpec) -> ServiceState:
        res = await self._launcher(0, "svcstate", svc.name, host=svc.host)
        kv = parse_kv(res.stdout)
        st = kv.get("station")
        return ServiceState(station=None if st in (None, "-") else st, pid=_int(kv.get("pid")),
                            alive=kv.get("alive") == "1", rc=_int(kv.get("rc")))

    async def service_log(self, svc: ServiceSpec, tail: int = 4000) -> str:
        res = await self.run(["tail", "-c", str(tail), f"{svc_dir(self.target, svc.name, svc.host)}/log"], host=svc.host)
        return res.stdout

    async def http(self, svc: ServiceSpec, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, str]:
        """One HTTP request to a service: (status, body); status None when nothing answered."""
        url = f"http://{svc.host}:{svc.port}{path}"
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.request(method, url)
                return r.status_code, r.text
        except httpx.HTTPError as e:
            return None, repr(e)

    async def health(self, svc: ServiceSpec, timeout: float = HEALTH_PROBE_S) -> bool:
        return (await self.http(health_target(svc), "GET", svc.health_path, timeout))[0] == 200

    def load_argv(self, key: str, plan: LoadPlan) -> list[str]:
        out = f"{self.root}/runs/{key}/out"
        argv = list(self.target.tuneloop or ("tuneloop",)) + [
            "load", "run", "--endpoint", plan.endpoint, "--scenario", plan.scenario, "--n", str(plan.n),
            "--concurrency", str(plan.concurrency), "--rate", _rate(plan.request_rate), "--out", out,
            "--warmup", str(plan.warmup), "--arrival", plan.arrival, "--burstiness", repr(plan.burstiness),
            "--cards", str(plan.cards), "--seed", str(plan.seed)]
        for name, url in plan.metrics.items():  # one per engine instance, named by its service
            argv += ["--metrics-url", f"{name}={url}"]
        return argv

    async def launch(self, key: str, plan: LoadPlan, epoch: int) -> int:
        res = await self._launcher(epoch, "run", key, "--", *self.load_argv(key, plan))
        return int(res.stdout.strip().splitlines()[-1])

    async def launch_argv(self, key: str, argv: list[str], epoch: int) -> int:
        """A detached run of any command (profiler windows, relayout steps, tests)."""
        res = await self._launcher(epoch, "run", key, "--", *argv)
        return int(res.stdout.strip().splitlines()[-1])

    async def poll(self, key: str) -> Markers:
        kv = parse_kv((await self._launcher(0, "poll", key)).stdout)
        if kv.get("claimed") != "1":
            return Markers(claimed=False)
        return Markers(claimed=True, pid=_int(kv.get("pid")), alive=kv.get("alive") == "1", rc=_int(kv.get("rc")),
                       done=kv.get("done") == "1", epoch=_int(kv.get("epoch")))

    async def requests_done(self, key: str) -> int | None:
        """Requests the running load has recorded so far (lines of its requests.jsonl); None before the first."""
        res = await self.run(["wc", "-l", f"{self.root}/runs/{key}/out/requests.jsonl"], timeout=10.0)
        head = res.stdout.split()[:1] if res.rc == 0 else []
        return int(head[0]) if head and head[0].isdigit() else None

    async def load_clock(self, key: str) -> float | None:
        """A real load runs on the wall's clock: there is no other clock to read (the simulator has one)."""
        return None

    async def fetch(self, key: str, dest: Path) -> Path:
        await self.fetch_dir(f"{self.root}/runs/{key}/out", dest)
        return dest

    async def run_log(self, key: str, tail: int = 4000) -> str:
        return (await self.run(["tail", "-c", str(tail), f"{self.root}/runs/{key}/log"])).stdout

    async def launch_log(self) -> str:
        return (await self.run(["cat", f"{self.root}/launch.log"])).stdout

    # -- what a real target measures ----------------------------------------------------------------
    async def source_identity(self) -> str:

        return await source_identity(self, self.target.engine, probe_service(self.target), self.target.python,
                                     self.target.image_digest)

    def cards_in_use(self, rendered: Any, knobs: dict[str, Any]) -> int:
        """The cards of the engine services this transport launches (routers and load hosts hold none)."""
        return adapter(self.target.engine).cards_in_use(rendered)

    async def until_healthy(self, svc: ServiceSpec, deadline: float, keepalive: Any, poll_s: float) -> None:
        """Poll the service's health route until it answers 200; a process that exits is a launch failure."""
        while True:
            st = await self.service_state(svc)
            if not st.alive:
                text = (await self.service_log(svc)).strip()
                raise PhaseFailure("launch_failure", f"{svc.name} exited during start-up (rc={st.rc}): {text[-3000:]}")
            code, text = await self.http(health_target(svc), "GET", svc.health_path,
                                         min(HEALTH_PROBE_S, max(0.2, deadline - time.monotonic())))
            if code == 200:
                return
            if time.monotonic() > deadline:
                last = f"HTTP {code}: {text[:200]}" if code is not None else text[:200]
                tail = (await self.service_log(svc)).strip()[-1500:]
                raise PhaseFailure("never_healthy", f"{svc.name}: {svc.health_path} never answered 200 (last probe: "
                                   f"{last}); its log ends: {tail}")
            await keepalive()
            await asyncio.sleep(poll_s)  # polling an external process, bounded by the deadline

    async def flush_prefix_caches(self, services: Any) -> dict[str, Any]:
        """Empty every engine's prefix cache: {"ok": all flushed, "cache_flush": one entry per service}."""

        done = [await flush_service(self, s, self.target.engine) for s in cache_holders(services)]
        return {"ok": all(d["ok"] for d in done), "cache_flush": done}

    async def dead_service_text(self, services: Any) -> str | None:
        """'<service> exited (rc=..) during the run: <its log tail>' for the first dead service, else None."""
        for svc in services:
            st = await self.service_state(svc)
            if not st.alive:
                text = (await self.service_log(svc)).strip()
                return f"{svc.name} exited (rc={st.rc}) during the run: {text[-3000:]}"
        return None

    async def spread_file(self, path: str, services: Any) -> None:
        """A file written on the load host (a fitted expert layout) is copied to every other engine host."""
        load_host = (self.target.host_entry(None) or self.target.hosts[0]).host
        others = sorted({s.host for s in services} - {load_host})
        if not others:
            return
        res = await self.run(["cat", path])
        if res.rc != 0:
            raise PhaseFailure("relayout_failed", f"relayout: the fitted layout {path} is missing: {res.stderr[-500:]}")
        for h in others:
            await self.run(["mkdir", "-p", path.rsplit("/", 1)[0]], host=h)
            await self.put_text(path, res.stdout, host=h)

    async def profile(self, run_dir: Path, rendered: Any) -> dict[str, Any]:
        """A short profiler window on each engine; the trace is analysed on the target, the summary comes back."""

        return await profile_window(self, rendered, self.target.profiler_seconds, self.target.python)

    def evaluate_quality(self, knobs: dict[str, Any], seed: int = 0) -> None:
        """No accuracy evaluation runs on a real target yet: a quality-risk change stays pending."""
        return None

    def costs(self, deploy: dict[str, Any], load: dict[str, Any], summary: Any, cards: int,
              profile_capture: bool) -> list[Any]:
        """What was measured: the deploy phase's seconds (less its relayout steps), the load's wall seconds."""
        return charges(deploy, float(load.get("seconds", 0.0)), cards,
                       self.target.profiler_seconds if profile_capture else None)


def health_target(svc: ServiceSpec) -> ServiceSpec:
    """The service as its health probe addresses it: on `health_port` where the engine answers health on a port of
    its own (MindIE's management port), at `health_host` where its leader answers for it (a vLLM headless worker),
    else on its service port. Every `http` (local, over ssh) takes the port
    from the spec, so the probe goes through the same route as any other request."""
    over = {k: v for k, v in (("port", svc.health_port), ("host", svc.health_host)) if v is not None}
    return svc.model_copy(update=over) if over else svc


def _rate(r: float) -> str:
    return "inf" if r == float("inf") else repr(float(r))


def remote_command(argv: list[str]) -> str:
    """The one place a remote shell string is built: shlex.join of validated argv, never formatting."""
    return shlex.join(argv)
