"""`sim` target: the simulator in virtual time behind the same interface as a real target.

Services are state files; a load is one `simulate` call written into a hidden directory and renamed
into place, so a run directory exists complete or not at all (a crash mid-load leaves nothing to
resume but a fresh start, which has no outside effect in virtual time). Epochs are fenced with
`fcntl.flock` + an epoch file, exactly as the launcher does on real targets.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from executor import records as rec
from executor.phases import crashpoint
from executor.targets import Target
from executor.templates import ServiceSpec
from executor.transports.base import AlreadyClaimed, CommandResult, LoadPlan, Markers, ServiceState, StaleLaunch


def _faults(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--fault"]


class SimTransport:
    virtual = True

    def __init__(self, target: Target, root: Path | None = None):
        self.target = target
        self.root = Path(root or target.run_root)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)
        (self.root / "svc").mkdir(parents=True, exist_ok=True)

    async def setup(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _log(self, line: str) -> None:
        with open(self.root / "launch.log", "a") as f:
            f.write(f"{time.time():.6f} {line}\n")

    @contextmanager
    def _fenced(self, epoch: int, what: str) -> Iterator[None]:
        with open(self.root / ".lock", "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            ep = self.root / "epoch"
            cur = int(ep.read_text()) if ep.exists() else 0
            if epoch < cur:
                self._log(f"refused {what} epoch={epoch} current={cur}")
                raise StaleLaunch(f"stale epoch: {epoch} < {cur} on this target (a newer lease holder exists); refused {what}")
            if epoch > cur:
                rec.write_atomic(ep, f"{epoch}\n")
            yield

    async def fence(self, epoch: int) -> None:
        with self._fenced(epoch, "fence"):
            pass

    def _svc_file(self, name: str) -> Path:
        return self.root / "svc" / name / "state.json"

    async def start_service(self, svc: ServiceSpec, station: str, epoch: int) -> None:
        with self._fenced(epoch, svc.name):
            faults = _faults(svc.argv)
            alive = "launch_failure" not in faults
            log = "" if alive else ("ERROR engine start-up failed: injected launch_failure "
                                     "(simulated engine exited before serving)\n")
            state = {"station": station, "alive": alive, "healthy": "never_healthy" not in faults, "log": log,
                     "argv": list(svc.argv)}
            self._svc_file(svc.name).parent.mkdir(parents=True, exist_ok=True)
            rec.write_atomic(self._svc_file(svc.name), json.dumps(state))
            self._log(f"start-service {svc.name} epoch={epoch} station={station}")

    async def stop_service(self, svc: ServiceSpec, epoch: int) -> None:
        with self._fenced(epoch, svc.name):
            self._svc_file(svc.name).unlink(missing_ok=True)
            self._log(f"stop-service {svc.name} epoch={epoch}")

    def _state(self, name: str) -> dict[str, Any] | None:
        p = self._svc_file(name)
        return json.loads(p.read_text()) if p.exists() else None

    async def service_state(self, svc: ServiceSpec) -> ServiceState:
        s = self._state(svc.name)
        if s is None:
            return ServiceState(station=None, pid=None, alive=False, rc=None)
        return ServiceState(station=s["station"], pid=None, alive=s["alive"], rc=None if s["alive"] else 1)

    async def service_log(self, svc: ServiceSpec, tail: int = 4000) -> str:
        s = self._state(svc.name)
        return (s or {}).get("log", "")[-tail:]

    async def health(self, svc: ServiceSpec, timeout: float = 2.0) -> bool:
        s = self._state(svc.name)
        return bool(s and s["alive"] and s["healthy"])

    async def http(self, svc: ServiceSpec, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, str]:
        """Virtual time has no HTTP: a live service answers 200 (each simulated load starts cache-cold)."""
        s = self._state(svc.name)
        return (200, "{}") if s and s["alive"] else (None, "not running")

    async def launch(self, key: str, plan: LoadPlan, epoch: int) -> int:
        with self._fenced(epoch, key):
            final = self.root / "runs" / key
            if final.exists():
                self._log(f"refused run {key} epoch={epoch} already-claimed")
                raise AlreadyClaimed(f"run {key} already claimed on this target")
            self._log(f"begin-run {key} epoch={epoch}")  # informational: the claim is the rename below
        partial = self.root / "runs" / f".{key}.partial"
        if partial.exists():
            shutil.rmtree(partial)
        (partial / "out").mkdir(parents=True)
        await asyncio.to_thread(self._simulate, plan, partial / "out")
        crashpoint("load", "mid")
        (partial / "epoch").write_text(f"{epoch}\n")
        rec.mark_done(partial, 0)
        with self._fenced(epoch, key):  # the claim is the rename: visible complete or not at all
            if final.exists():
                raise AlreadyClaimed(f"run {key} already claimed on this target")
            os.replace(partial, final)
            self._log(f"start-run {key} epoch={epoch}")
            self._log(f"end-run {key} epoch={epoch} rc=0")
        return os.getpid()

    def _simulate(self, plan: LoadPlan, out: Path) -> None:
        from simulator import engine, profiles, scenarios
        from simulator.faults import Faults

        faults = Faults.parse(list(plan.faults)) if plan.faults else None
        knobs = dict(plan.knobs) | {"concurrency": plan.concurrency, "request_rate": plan.request_rate}
        run = engine.simulate(profiles.load(self.target.profile), scenarios.load(plan.scenario), knobs, plan.n,
                              warmup=plan.warmup, seed=plan.seed, faults=faults, arrival=plan.arrival,
                              burstiness=plan.burstiness)
        engine.write_run_dir(run, out)

    async def poll(self, key: str) -> Markers:
        d = self.root / "runs" / key
        if not d.exists():
            return Markers(claimed=False)
        rc = int((d / rec.RC).read_text()) if (d / rec.RC).exists() else None
        ep = int((d / "epoch").read_text()) if (d / "epoch").exists() else None
        return Markers(claimed=True, pid=None, alive=False, rc=rc, done=(d / rec.DONE).exists(), epoch=ep)

    async def requests_done(self, key: str) -> int | None:
        """The simulated load is written whole when it ends: its request count, or None before."""
        p = self.root / "runs" / key / "out" / rec.REQUESTS
        return sum(1 for _ in p.open("rb")) if p.exists() else None

    async def fetch(self, key: str, dest: Path) -> Path:
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.root / "runs" / key / "out", dest)
        return dest

    async def run(self, argv: list[str], timeout: float = 60.0) -> CommandResult:
        return CommandResult(0, "", "")

    async def run_log(self, key: str, tail: int = 4000) -> str:
        return ""

    async def launch_log(self) -> str:
        p = self.root / "launch.log"
        return p.read_text() if p.exists() else ""
