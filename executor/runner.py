"""The deterministic executor: run_trial(spec) through durable, fenced phases, and resume after a crash.

This module is the executor's public face (run, resume, restore, UNKNOWN targets); the phase machine is
executor/trialrun.py, its phases executor/phase_deploy.py, phase_load.py and phase_collect.py, the lease
executor/lease.py, and everything that differs between targets lives in the transports.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from core import records as rec
from core.canonical import canon
from core.errors import FieldError
from core.executor_port import QualityEvaluation
from core.journal import as_record
from core.station import content_hash
from core.summary import Reason, Verdict
from core.trial import TrialResult, TrialSpec
from executor.lease import TargetLease
from executor.phases import (
    ExecSettings,
    PhaseFailure,
    TargetUnknown,
    UnknownState,
    finished,
)
from executor.runjournal import LostLease, RunJournal
from executor.targets import Target, builtin_sim
from executor.transports import make_transport
from executor.transports.base import StaleLaunch
from executor.trialrun import TrialRun
from executor.transports.sim import predict_station
from executor.twin import Twins, prior_of

__all__ = ["Executor", "LostLease", "dump_result", "is_unknown", "load_result"]

log = logging.getLogger("tuneloop.executor")
RESULT, SPEC = "result.json", "spec.json"
TransportFactory = Callable[[Target, Path], Any]


def default_transports(target: Target, state_root: Path) -> Any:
    return make_transport(target, state_root=state_root / "_targets" / target.name)


class Executor:
    def __init__(self, store: Any, targets: dict[str, Target] | None = None, settings: ExecSettings | None = None,
                 transports: TransportFactory = default_transports):
        self.store = store
        self.targets = dict(targets or {})
        self.targets.setdefault("sim", builtin_sim())
        self.settings = settings or ExecSettings.from_env()
        self.root = Path(self.settings.runs_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.transports = transports
        self.twins = Twins(self.root)  # goals' twins fitted to their runs under this root (executor/twin.py)

    # -- public API (core/executor_port.py ExecutorPort: what the loop and the planner see) ----------------
    @property
    def runs_root(self) -> Path:
        return self.settings.runs_root

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run (or finish, or return) the trial; idempotent on spec.run_id."""
        return _sync(self.arun_trial(spec))

    def resume_all(self) -> list[TrialResult]:
        """Finish every unfinished run found under the runs root, by its records and target markers."""
        return _sync(self.aresume_all())

    async def aresume_all(self) -> list[TrialResult]:
        out = []
        for spec_file in sorted(self.root.glob(f"*/{SPEC}")):
            spec = TrialSpec.model_validate_json(spec_file.read_text())
            recs = [as_record(r) for r in self.store.phases(spec.run_id)]
            if finished(recs) and (spec_file.parent / RESULT).exists():
                continue
            unknown = self.unknown_targets()
            if spec.target in unknown:
                log.warning("target %s is UNKNOWN; not resuming %s", spec.target, spec.run_id)
                out.append(_unknown_result(spec, unknown[spec.target]))
                continue
            out.append(await self.arun_trial(spec))
        return out

    def unknown_targets(self) -> dict[str, str]:
        """Targets on which a run's state could not be read: no work is issued to them until cleared. The store
        keeps this (a run with status "unknown" on the target), so every executor and the loop read one record."""
        return self.store.unknown_targets()

    def clear_unknown(self, target: str, who: str = "executor", why: str = "") -> list[str]:
        return self.store.clear_unknown(target, who, why)

    def mark_unknown(self, spec: TrialSpec, why: str) -> None:
        self.store.mark_unknown(spec, why)

    def calibrated(self, target: str) -> bool:
        """Whether `target` has a calibrated profile to simulate stations on (else `predict_station` is None)."""
        t = self.targets.get(target)
        return t is not None and bool(t.calibrated_profile)

    def bind_sim_profile(self, target: str, profile: str | None) -> None:
        """A goal on a simulator target is simulated on the goal's own `sim_profile` (its cards, costs and engine),
        whichever executor runs it: the built-in `sim` target alone would always be the dsv4 one. A target's
        `truth_profile` (a truth the goal does not name, e.g. bench --perturb-truth) is left alone: the simulator
        runs it, while the goal's profile stays the planner's prior. Nothing for another target."""
        t = self.targets.get(target)
        if t is None or t.kind != "sim" or not profile or t.profile == profile:
            return
        self.targets[target] = t.model_copy(update={"profile": profile})

    def predict_station(self, target: str, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0,
                        seed: int = 0, slos: dict[str, float] | None = None) -> dict[str, Any] | None:
        """The calibrated simulator's prediction of one station on a target (None: the target has no
        `calibrated_profile`): output tok/s, per card, mean TPOT and TTFT, and the whole Summary with the goal's
        SLOs (executor.transports.sim)."""
        t = self.targets.get(target)
        if t is None or not t.calibrated_profile:
            return None
        return predict_station(t.calibrated_profile, scenario, knobs, n, warmup=warmup, seed=seed, slos=slos)

    def twin_fitter(self, target: str, sim_profile: str | None) -> Callable[[tuple[str, ...]], Any] | None:
        """The goal's twin fitter on this target (run ids -> executor.twin.Twin, or why not); None: no target. A
        real target without a calibrated profile that names its card starts from a prior derived from its model,
        card and topology (executor/derived.py); where none can be derived every fit answers why (the rules lead,
        and the cards say so); a target that names no card has no twin."""
        try:
            prior = prior_of(self.targets.get(target), sim_profile, self.root)
        except (FieldError, ValueError, OSError) as e:
            why = f"no prior to fit from: {e}"
            return lambda runs: why
        if prior is None:
            return None
        return lambda runs: self.twins.fit(prior, tuple(runs))

    def evaluate_quality(self, target: str, knobs: dict[str, Any], seed: int = 0) -> QualityEvaluation | None:
        """The accuracy evaluation behind the quality gate, where the target offers one (else None)."""
        return self.transports(self.targets[target], self.root).evaluate_quality(knobs, seed)

    def station_of(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.root / run_id / "station.json").read_text())

    def restore(self, station: str) -> dict[str, Any]:
        """`tuneloop restore`: re-deploy a frozen station (by hash or run id) and check its health."""
        return _sync(self.arestore(station))

    def find_station(self, station: str) -> tuple[TrialSpec, dict[str, Any]]:
        for p in sorted(self.root.glob("*/station.json")):
            st = json.loads(p.read_text())
            if st.get("hash") == station or p.parent.name == station:
                return TrialSpec.model_validate_json((p.parent / SPEC).read_text()), st
        raise LookupError(f"station {station!r}: no run under {self.root} froze a station with this hash or run id")

    def _open(self, spec: TrialSpec, earlier: list) -> TrialRun:
        target = self.targets[spec.target]
        transport = self.transports(target, self.root)
        journal = RunJournal(self.store, spec.run_id, spec.target, earlier)
        lease = TargetLease(self.store, journal, self.settings, transport)
        return TrialRun(spec, target, self.root / spec.run_id, transport, journal, lease, self.settings)

    async def arestore(self, station: str) -> dict[str, Any]:
        old, st = self.find_station(station)
        if old.target not in self.targets:
            raise LookupError(f"station {st['hash']} ran on target {old.target!r}, which is not defined here (known: "
                              f"{sorted(self.targets)}): give the targets file it ran with (--targets)")
        spec = TrialSpec(run_id=f"restore-{st['hash']}-{time.time_ns()}", goal_id=old.goal_id, target=old.target,
                         scenario=old.scenario, knobs=st["knobs"], stage="restore", n=1, seed=old.seed)
        run = self._open(spec, [])
        run.work.mkdir(parents=True, exist_ok=True)
        rec.write_atomic(run.work / SPEC, spec.model_dump_json(indent=1))
        prep: dict[str, Any] = {}
        dep: dict[str, Any] = {}
        try:
            await run.transport.setup()
            await run.lease.lock()
            healthy, error = False, None
            try:
                prep = await run.phase("prepare", run.prepare)
                dep = await run.phase("deploy", run.deploy)
                await run.phase("health", run.health)
                healthy = True
            except PhaseFailure as e:
                error = str(e)
            await run.lease.release(healthy=healthy)
            restored = run.station.model_dump(mode="python") if run.station is not None else None
            differs = station_differences(st, restored)
            return {"station": st["hash"], "restored_hash": prep.get("station_hash"),
                    "identical": not differs, "differs": differs, "restarted": dep.get("restarted"),
                    "healthy": healthy, "error": error, "run_id": spec.run_id}
        finally:
            await run.transport.close()

    async def arun_trial(self, spec: TrialSpec) -> TrialResult:
        work = self.root / spec.run_id
        work.mkdir(parents=True, exist_ok=True)
        sp = work / SPEC
        if sp.exists():
            old = TrialSpec.model_validate_json(sp.read_text())
            if old != spec:
                raise FieldError("run_id", f"{spec.run_id!r} was already used for a different spec")
        else:
            rec.write_atomic(sp, spec.model_dump_json(indent=1))
        recs = [as_record(r) for r in self.store.phases(spec.run_id)]
        res = work / RESULT
        unknown = self.unknown_targets()
        if finished(recs) and res.exists():
            stored = load_result(res)
            # a collection fault is re-collected; an UNKNOWN run resumes its phases once a person has cleared the
            # target (a load claim still there without its process is UNKNOWN again)
            if stored.verdict.kind != "collection_fault" and not (is_unknown(stored) and spec.target not in unknown):
                return stored
        if spec.target not in self.targets:
            raise FieldError("target", f"{spec.target!r} is not defined (known: {sorted(self.targets)})")
        if spec.target in unknown:
            raise TargetUnknown(f"target {spec.target!r} is UNKNOWN: {unknown[spec.target]}")
        run = self._open(spec, recs)
        try:
            return await self._execute(run)
        finally:
            await run.transport.close()

    async def _execute(self, run: TrialRun) -> TrialResult:
        await run.transport.setup()
        await run.lease.lock()
        try:
            result = await run.body()
        except (LostLease, StaleLaunch):
            raise  # a newer holder owns the target: write nothing more, release nothing
        except UnknownState as e:
            self.mark_unknown(run.spec, str(e))
            log.error("target %s UNKNOWN after run %s: %s; no further work is issued to it",
                      run.spec.target, run.spec.run_id, e)
            result = _unknown_result(run.spec, str(e))
            rec.write_atomic(run.work / RESULT, dump_result(result))
            await run.lease.release(healthy=False)
            return result
        rec.write_atomic(run.work / RESULT, dump_result(result))
        await run.lease.release(healthy=result.healthy_after)
        return result


def _unknown_result(spec: TrialSpec, why: str) -> TrialResult:
    v = Verdict(kind="orchestration_fault", reasons=[Reason(code="unknown_state", message=f"UNKNOWN: {why}")])
    return TrialResult(run_id=spec.run_id, verdict=v, healthy_after=False, failed_phase="load", error=f"UNKNOWN: {why}")


def is_unknown(result: TrialResult) -> bool:
    return any(r.code == "unknown_state" for r in result.verdict.reasons)


def dump_result(result: TrialResult) -> str:
    """JSON that keeps inf (an infinite request rate) as Infinity, so the file round-trips."""
    return json.dumps(result.model_dump(mode="python"), indent=1, default=str)


def load_result(p: Path) -> TrialResult:
    return TrialResult.model_validate(json.loads(p.read_text()))


def _sync(coro: Awaitable[Any]) -> Any:
    """Run a coroutine from sync code, also when the caller already sits inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    box: dict[str, Any] = {}

    def _t() -> None:
        try:
            box["v"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["e"] = e
    th = threading.Thread(target=_t)
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def station_differences(frozen: dict[str, Any], restored: dict[str, Any] | None) -> dict[str, list[Any]]:
    """What a restored station has other than the frozen one, field by field (a knob as `knobs.NAME`):
    {field: [frozen, restored]}; empty when the two are the same station. Not restored at all (its prepare
    failed): {"station": [the frozen hash, None]}."""
    if restored is None:
        return {"station": [frozen.get("hash"), None]}
    out: dict[str, list[Any]] = {}
    for key in sorted(set(frozen) | set(restored)):
        if key in ("hash", "knobs"):
            continue
        if frozen.get(key) != restored.get(key):
            out[key] = [frozen.get(key), restored.get(key)]
    was, now = frozen.get("knobs") or {}, restored.get("knobs") or {}
    for name in sorted(set(was) | set(now)):
        if canon(was.get(name)) != canon(now.get(name)):
            out[f"knobs.{name}"] = [was.get(name), now.get(name)]
    if not out and frozen.get("hash") != content_hash(restored):
        out["hash"] = [frozen.get("hash"), content_hash(restored)]  # the same fields, another digest (a new hash rule)
    return out
