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
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator

from core import profiles, scenarios
from core.profiles import Profile
from core import records as rec
from core.canonical import digest
from core.metrics import summarize
from core.summary import Summary
from core.trial import CostEntry
from executor.costs import charges
from executor.phases import PhaseFailure, crashpoint
from executor.targets import Target
from executor.templates import ServiceSpec
from executor.transports.base import (
    AlreadyClaimed,
    CommandResult,
    LoadPlan,
    Markers,
    ServiceState,
    StaleLaunch,
)
from simulator import engine, quality, stations
from simulator.calibrate import calibrate
from simulator.faults import Faults
# a derived prior's roofline (executor/derived.py, executor/cpu_probe.py read it through this door)
from simulator.derive import Derived, RoleShape, Topology, derive, derive_for_profile, error_table  # noqa: F401
from simulator.model_spec import ModelSpec  # noqa: F401


def predict_station(profile: str, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                    arrival: str = "constant", burstiness: float = 1.0,
                    slos: dict[str, float] | None = None) -> dict[str, Any]:
    """The executor's door to a simulated prediction of one station with a (calibrated) profile, name or YAML path:
    output tok/s (whole window, and per card), mean TPOT and TTFT, the cards in use, and `summary`, the run's whole
    Summary with the goal's SLOs (`slos`: goodput), so a caller reads any figure a goal names."""
    prof = profiles.load(profile)
    s, left = simulate_station(prof, scenario, knobs, n, warmup=warmup, seed=seed, slos=slos, arrival=arrival,
                               burstiness=burstiness)
    return {"profile": prof.name, "summary": s, "cards": s.cards, "knobs_not_modelled": left,
            "knobs_used": stations.sim_knobs(knobs)[0],
            "output_tok_s": s.whole.output_tok_s if s.whole else None,
            "output_tok_s_per_card": s.whole.output_tok_s_per_card if s.whole else None,
            "tpot_mean_ms": s.tpot_ms.mean, "ttft_mean_ms": s.ttft_ms.mean}


def simulate_station(profile: Profile, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                     slos: dict[str, float] | None = None, native_min_requests: int = 128,
                     native_min_seconds: float = 60.0, arrival: str = "constant",
                     burstiness: float = 1.0) -> tuple[Summary, list[str]]:
    """One station simulated with a profile in memory, summarised by the code that summarises every run
    (core.metrics.summarize, with the goal's SLOs, so goodput is defined, and its native-window rule): the goal's
    twin predicts a whole Summary (executor/twin.py). Also the knobs the simulator does not model."""
    mapped, left = stations.sim_knobs(knobs)
    run = engine.simulate(profile, scenario, profile.knobs(mapped), n=n, warmup=warmup, seed=seed, arrival=arrival,
                          burstiness=burstiness, observe=False)
    return summarize(run.records, run.info, slos=slos, native_min_requests=native_min_requests,
                     native_min_seconds=native_min_seconds), left


def calibrate_runs(run_dirs: list[Path], prior: str,
                   name: str) -> tuple[Profile, list[tuple[str, float, float | None, str]]]:
    """A profile calibrated to these run directories from the prior (simulator.calibrate), and its coefficient
    table; CalibrationError (or a solver's error) when the runs cannot be fitted."""
    cal = calibrate(run_dirs, profiles.load(prior), name=name)
    return cal.profile, cal.table()


SIM_PROGRESS = "sim_progress.json"  # beside a simulated load's out/: requests done and the virtual clock so far


def _faults(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--fault"]


class SimTransport:
    """Virtual time: what a real target measures, the simulator computes (cards from the profile's layout,
    costs from the profile's fixed costs, the time breakdown from the simulated run)."""

    virtual = True
    PROGRESS_EVERY_S = 0.25  # wall seconds between two notes of a running simulation (each is a file write)

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
        """The load in virtual time, noting requests done and the virtual clock beside `out` as it goes (the
        executor polls them while the simulation runs: a long simulated load shows its count moving)."""
        faults = Faults.parse(list(plan.faults)) if plan.faults else None
        knobs = dict(plan.knobs) | {"concurrency": plan.concurrency, "request_rate": plan.request_rate}
        last = [0.0, 0.0]  # when the last note was written (wall), the virtual clock at the last completion

        def progress(done: int, t: float) -> None:
            last[1] = t
            if time.monotonic() - last[0] >= self.PROGRESS_EVERY_S:
                last[0] = time.monotonic()
                self._note(out.parent, done, t)

        run = engine.simulate(self._profile(), scenarios.load(plan.scenario), knobs, plan.n,
                              warmup=plan.warmup, seed=plan.seed, faults=faults, arrival=plan.arrival,
                              burstiness=plan.burstiness, on_progress=progress)
        engine.write_run_dir(run, out)
        self._note(out.parent, len(run.records), last[1])

    def _note(self, run_dir: Path, done: int, t: float) -> None:
        """Requests done and the virtual seconds so far of a simulated load, in its (partial) run directory."""
        rec.write_atomic(run_dir / SIM_PROGRESS, json.dumps({"requests_done": done, "virtual_s": round(t, 3)}))

    def _noted(self, key: str) -> dict[str, Any]:
        for d in (self.root / "runs" / key, self.root / "runs" / f".{key}.partial"):
            try:
                return json.loads((d / SIM_PROGRESS).read_text())
            except (OSError, ValueError):
                continue
        return {}

    async def poll(self, key: str) -> Markers:
        d = self.root / "runs" / key
        if not d.exists():
            return Markers(claimed=False)
        rc = int((d / rec.RC).read_text()) if (d / rec.RC).exists() else None
        ep = int((d / "epoch").read_text()) if (d / "epoch").exists() else None
        return Markers(claimed=True, pid=None, alive=False, rc=rc, done=(d / rec.DONE).exists(), epoch=ep)

    async def requests_done(self, key: str) -> int | None:
        """Requests the simulated load has completed: its written count once it ended, else the count the
        running simulation noted last; None before the first completed."""
        p = self.root / "runs" / key / "out" / rec.REQUESTS
        if p.exists():
            return sum(1 for _ in p.open("rb"))
        return self._noted(key).get("requests_done")

    async def load_clock(self, key: str) -> float | None:
        """Virtual seconds the simulated load has covered so far (from its first send): the simulator's clock,
        which runs far faster than the wall's. None before the first request completed."""
        return self._noted(key).get("virtual_s")

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

    # -- what differs from a real target ------------------------------------------------------------
    def _profile(self) -> Any:
        """The profile simulated: the target's truth where it has one (Target.truth_profile), else its profile."""
        return profiles.load(self.target.simulated_profile)

    async def source_identity(self) -> str:
        """Names the profile the goal knows; a hidden truth adds only a digest of its content (never its name, path
        or coefficients: the planner reads this identity), so two truths are two sources."""
        ident = f"simulator:tuneloop-{version('tuneloop')}:profile={profiles.load(self.target.profile).name}"
        if self.target.truth_profile is None:
            return ident
        return f"{ident}:truth={digest(self._profile().model_dump(mode='json', exclude={'deployment', 'derived'}))[:12]}"

    def cards_in_use(self, rendered: Any, knobs: dict[str, Any]) -> int:
        """The simulated layout's cards: instances x cards per instance, from the station's knobs."""
        return self._profile().cards(knobs)

    async def until_healthy(self, svc: ServiceSpec, deadline: float, keepalive: Any, poll_s: float) -> None:
        """Virtual time: a service is healthy at once or never (no clock to wait on)."""
        st = await self.service_state(svc)
        if not st.alive:
            text = (await self.service_log(svc)).strip()
            raise PhaseFailure("launch_failure", f"{svc.name} exited during start-up (rc={st.rc}): {text[-3000:]}")
        if not await self.health(svc):
            raise PhaseFailure("never_healthy", f"{svc.name}: {svc.health_path} never answered 200")

    async def flush_prefix_caches(self, services: Any) -> dict[str, Any]:
        return {"ok": True, "cache_flush": "not needed: every simulated load starts with an empty cache"}

    async def dead_service_text(self, services: Any) -> str | None:
        """A simulated engine does not die during a load (a crash fault is simulated inside the run)."""
        return None

    async def spread_file(self, path: str, services: Any) -> None:
        return None

    async def profile(self, run_dir: Path, rendered: Any) -> dict[str, Any]:
        br = run_dir / rec.BREAKDOWN
        if br.exists():
            return {"summary": json.loads(br.read_text()), "source": "simulator breakdown"}
        return {"summary": None, "source": "simulator breakdown missing"}

    def evaluate_quality(self, knobs: dict[str, Any], seed: int = 0) -> Any:
        """The simulator's modelled accuracy evaluation of a station (the quality gate)."""

        return quality.evaluate(self._profile(), knobs, seed=seed)

    def costs(self, deploy: dict[str, Any], load: dict[str, Any], summary: Summary | None, cards: int,
              profile_capture: bool) -> list[CostEntry]:
        """The profile's fixed costs; the load's virtual seconds from the first send to the last completion."""
        load_s = summary.whole.end if summary is not None and summary.whole is not None else float(load.get("seconds", 0.0))
        return charges(deploy, load_s, cards, self.target.profiler_seconds if profile_capture else None,
                       self._profile().costs)
