"""The deterministic executor: run_trial(spec) through durable, fenced phases, and resume after a crash.

    lock -> prepare -> deploy -> health -> warmup -> load [-> profile] -> collect -> validate -> release

Every phase writes an intent record before its side effect and an outcome after it, both carrying
the lease epoch. Side-effecting phases whose outcome is recorded ok are never redone; pure ones
(prepare, collect, validate) are simply recomputed. A load is identified by its run directory on the
target: the launcher's mkdir claim makes a second launch impossible, so a resumed run reads the
markers instead of guessing.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from executor import records as rec
from executor.journal import as_record, is_stale_epoch
from executor.knobs import KnobError
from executor.phases import (ExecSettings, PhaseFailure, SKIP_WHEN_OK, TargetUnknown, UnknownState, crashpoint,
                             finished, load_resume_action, ok_phases)
from executor.profilers_capture import profile_window
from executor.station import Station, change_cost, content_hash, full_knobs, needs_restart
from executor.summary import Reason, Summary, Verdict
from executor.targets import Target, builtin_sim
from executor.templates import ENGINE_KEY, Rendered, ServiceSpec, render
from executor.transports.base import AlreadyClaimed, LoadPlan, StaleLaunch, Transient
from executor.trial import CostEntry, TrialResult, TrialSpec

log = logging.getLogger("tuneloop.executor")
RESULT, SPEC = "result.json", "spec.json"
PROGRESS = "progress.json"  # requests done / N of the running load (the API and `tuneloop run` show it)


class LostLease(RuntimeError):
    """Our lease was taken over (we were paused or partitioned): stop touching the target."""


class Executor:
    def __init__(self, store: Any, targets: dict[str, Target] | None = None, settings: ExecSettings | None = None):
        self.store = store
        self.targets = dict(targets or {})
        self.targets.setdefault("sim", builtin_sim())
        self.settings = settings or ExecSettings.from_env()
        self.root = Path(self.settings.runs_root)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- public API ------------------------------------------------------------------------------
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
            if self.unknown_targets().get(spec.target):
                log.warning("target %s is UNKNOWN; not resuming %s", spec.target, spec.run_id)
                out.append(_unknown_result(spec, self.unknown_targets()[spec.target]))
                continue
            out.append(await self.arun_trial(spec))
        return out

    def unknown_targets(self) -> dict[str, str]:
        """Targets on which a run's state could not be read: no work is issued to them until cleared."""
        d = self.root / "_unknown"
        return {p.stem: p.read_text() for p in d.glob("*.txt")} if d.exists() else {}

    def clear_unknown(self, target: str) -> None:
        (self.root / "_unknown" / f"{target}.txt").unlink(missing_ok=True)

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

    async def arestore(self, station: str) -> dict[str, Any]:
        old, st = self.find_station(station)
        spec = TrialSpec(run_id=f"restore-{st['hash']}-{time.time_ns()}", goal_id=old.goal_id, target=old.target,
                         scenario=old.scenario, knobs=st["knobs"], stage="restore", n=1, seed=old.seed)
        run = _Run(self, spec, self.targets[spec.target], self.root / spec.run_id, [])
        run.work.mkdir(parents=True, exist_ok=True)
        rec.write_atomic(run.work / SPEC, spec.model_dump_json(indent=1))
        try:
            await run.transport.setup()
            await run.lock()
            healthy, error = False, None
            try:
                prep = await run.phase("prepare", run.prepare)
                dep = await run.phase("deploy", run.deploy)
                await run.phase("health", run.health)
                healthy = True
            except PhaseFailure as e:
                prep, dep, error = locals().get("prep", {}), locals().get("dep", {}), str(e)
            await run.release(healthy=healthy)
            same = prep.get("station_hash") == st["hash"]
            return {"station": st["hash"], "restored_hash": prep.get("station_hash"), "identical": same,
                    "restarted": dep.get("restarted"), "healthy": healthy, "error": error, "run_id": spec.run_id}
        finally:
            await run.transport.close()

    async def arun_trial(self, spec: TrialSpec) -> TrialResult:
        work = self.root / spec.run_id
        work.mkdir(parents=True, exist_ok=True)
        sp = work / SPEC
        if sp.exists():
            old = TrialSpec.model_validate_json(sp.read_text())
            if old != spec:
                raise ValueError(f"run_id: {spec.run_id!r} was already used for a different spec")
        else:
            rec.write_atomic(sp, spec.model_dump_json(indent=1))
        recs = [as_record(r) for r in self.store.phases(spec.run_id)]
        res = work / RESULT
        if finished(recs) and res.exists():
            stored = load_result(res)
            if stored.verdict.kind != "collection_fault":
                return stored
        if spec.target not in self.targets:
            raise ValueError(f"target: {spec.target!r} is not defined (known: {sorted(self.targets)})")
        if spec.target in self.unknown_targets():
            raise TargetUnknown(f"target {spec.target!r} is UNKNOWN: {self.unknown_targets()[spec.target]}")
        target = self.targets[spec.target]
        run = _Run(self, spec, target, work, recs)
        try:
            return await run.execute()
        finally:
            await run.transport.close()


class _Run:
    """One invocation of one trial: the phase machine with its lease and transport."""

    def __init__(self, ex: Executor, spec: TrialSpec, target: Target, work: Path, recs: list):
        from executor.transports import make_transport

        self.ex, self.spec, self.target, self.work = ex, spec, target, work
        self.s = ex.settings
        self.ok_before = ok_phases(recs)
        self.recs = recs
        if target.kind == "sim":
            self.transport = make_transport(target, root=ex.root / "_targets" / target.name)
        else:
            self.transport = make_transport(target)
        self.epoch = 0
        self.costs: list[CostEntry] = []
        self._progress_at = 0.0  # when the load's requests were last counted (note_progress)
        self.station: Station | None = None
        self.rendered: Rendered | None = None
        self.restarted = False
        self.cards = target.cards or 1
        self.zero_cache = False

    # -- journal --------------------------------------------------------------------------------
    def record(self, phase: str, event: str, status: str, detail: dict | None = None, error_class: str | None = None):
        try:
            self.ex.store.record_phase(self.spec.run_id, phase, event, status, epoch=self.epoch,
                                       target=self.spec.target, detail=detail, error_class=error_class)
        except Exception as e:  # noqa: BLE001 - only the store's StaleEpoch is turned into LostLease
            if is_stale_epoch(e):
                raise LostLease(f"run {self.spec.run_id}: journal refused epoch {self.epoch}: {e}") from e
            raise

    async def renew(self) -> None:
        if not self.ex.store.renew_lease(self.spec.target, self.s.holder, self.epoch, self.s.lease_ttl_s):
            raise LostLease(f"target {self.spec.target!r}: lease at epoch {self.epoch} was lost")

    async def phase(self, name: str, fn: Callable[[], Awaitable[dict]], intent: dict | None = None) -> dict:
        await self.renew()
        self.record(name, "intent", "started", intent)
        crashpoint(name, "before")
        t0 = time.perf_counter_ns()
        try:
            detail = await asyncio.wait_for(fn(), timeout=self.s.timeout(name))
        except asyncio.TimeoutError:
            err = PhaseFailure("timeout", f"{name}: no outcome within {self.s.timeout(name):g}s")
            self.record(name, "outcome", "failed", {"error": str(err)}, err.error_class)
            raise err from None
        except UnknownState as e:
            self.record(name, "outcome", "unknown", {"error": str(e)}, e.error_class)
            raise
        except PhaseFailure as e:
            self.record(name, "outcome", "failed", {"error": str(e)[-4000:]}, e.error_class)
            raise
        except (StaleLaunch, LostLease):
            raise
        crashpoint(name, "after")
        detail = dict(detail or {}) | {"seconds": (time.perf_counter_ns() - t0) / 1e9}
        self.record(name, "outcome", "ok", detail)
        crashpoint(name, "done")
        return detail

    # -- the machine ------------------------------------------------------------------------------
    async def execute(self) -> TrialResult:
        await self.transport.setup()
        await self.lock()
        try:
            result = await self.body()
        except (LostLease, StaleLaunch):
            raise  # a newer holder owns the target: write nothing more, release nothing
        except UnknownState as e:
            self.ex.root.joinpath("_unknown").mkdir(exist_ok=True)
            rec.write_atomic(self.ex.root / "_unknown" / f"{self.spec.target}.txt",
                             f"run {self.spec.run_id}: {e}\n")
            log.error("target %s UNKNOWN after run %s: %s; no further work is issued to it",
                      self.spec.target, self.spec.run_id, e)
            result = _unknown_result(self.spec, str(e))
            self.save(result)
            await self.release(healthy=False)
            return result
        self.save(result)
        await self.release(healthy=result.healthy_after)
        return result

    def save(self, result: TrialResult) -> None:
        rec.write_atomic(self.work / RESULT, dump_result(result))

    async def lock(self) -> None:
        tgt = self.spec.target
        for _ in range(100):  # the intent carries the epoch current now; another holder may move it meanwhile
            self.epoch = self.ex.store.current_epoch(tgt)
            try:
                self.record("lock", "intent", "started", {"holder": self.s.holder})
                break
            except LostLease:
                await asyncio.sleep(0.01)
        else:
            raise PhaseFailure("lock_timeout", f"target {tgt!r}: could not record the lock intent")
        deadline = time.monotonic() + self.s.lock_wait_s
        delay = 0.05
        while True:
            ep = self.ex.store.acquire_lease(tgt, self.s.holder, self.s.lease_ttl_s)
            if ep is not None:
                break
            if time.monotonic() > deadline:
                raise PhaseFailure("lock_timeout", f"target {tgt!r}: lease not free within {self.s.lock_wait_s:g}s")
            await asyncio.sleep(delay)  # waiting for another holder's lease, not synchronising a test
            delay = min(delay * 2, 1.0)
        self.epoch = ep
        crashpoint("lock", "after")
        await self.transport.fence(ep)  # the target learns the new epoch before anything else happens
        self.record("lock", "outcome", "ok", {"holder": self.s.holder, "epoch": ep})
        crashpoint("lock", "done")

    async def release(self, healthy: bool) -> None:
        self.record("release", "intent", "started", {"healthy_after": healthy})
        crashpoint("release", "before")
        # the outcome goes in first: once the lease is given up, another holder may move the epoch at once
        # and a write with ours is (rightly) refused. A crash in between leaves a lease that expires by TTL.
        self.record("release", "outcome", "ok", {"healthy_after": healthy})
        self.ex.store.release_lease(self.spec.target, self.s.holder, self.epoch)

    async def body(self) -> TrialResult:
        try:
            prep = await self.phase("prepare", self.prepare)
        except PhaseFailure as e:
            return self.fault_result("prepare", "orchestration_fault", "invalid_station", str(e))
        try:
            for name, fn in (("deploy", self.deploy), ("health", self.health), ("warmup", self.warmup)):
                if name in self.ok_before and name in SKIP_WHEN_OK:
                    continue
                await self.phase(name, fn)
            load = await self.load_phase()
        except UnknownState:
            raise
        except PhaseFailure as e:
            return self.fault_result(self.current_phase(), "orchestration_fault", e.error_class, str(e), prep)
        profile = None
        if self.spec.profile_capture:
            profile = await self.phase("profile", self.profile) if "profile" not in self.ok_before else None
        return await self.collect_and_validate(prep, load, profile)

    def current_phase(self) -> str:
        recs = [as_record(r) for r in self.ex.store.phases(self.spec.run_id)]
        return recs[-1].phase if recs else "prepare"

    # -- phases ------------------------------------------------------------------------------------
    async def prepare(self) -> dict:
        from simulator import scenarios

        engine_key = ENGINE_KEY[self.target.engine]
        try:
            knobs = full_knobs(self.spec.knobs, engine_key)
            scenario = scenarios.load(self.spec.scenario)
        except (KnobError, FileNotFoundError, ValueError) as e:
            raise PhaseFailure("invalid_station", str(e)) from None
        self.zero_cache = scenario.zero_cache
        source = await self.source_identity()
        self.station = Station(engine=self.target.engine, knobs=knobs, scenario=self.spec.scenario,
                               data_version=scenario.data_version, source_identity=source, target=self.target.name)
        try:
            self.rendered = render(self.target, self.station, tuple(self.spec.faults),
                                   expected_requests=self.spec.n + self.spec.warmup)
        except ValueError as e:
            raise PhaseFailure("invalid_station", str(e)) from None
        frozen = self.station.model_dump(mode="python") | {"hash": self.station.hash}  # python mode keeps inf
        rec.write_atomic(self.work / "station.json", json.dumps(frozen, indent=1, sort_keys=True))
        rec.write_atomic(self.work / "rendered.json", self.rendered.model_dump_json(indent=1))
        return {"station_hash": self.station.hash, "server_hash": self.station.server_hash, "source_identity": source,
                "data_version": scenario.data_version, "services": [s.name for s in self.rendered.services]}

    async def source_identity(self) -> str:
        if self.target.engine == "sim":
            from importlib.metadata import version

            from simulator import profiles

            p = profiles.load(self.target.profile)
            return f"simulator:tuneloop-{version('tuneloop')}:profile={p.name}"
        from executor.identity import source_identity

        return await source_identity(self.transport, self.target.engine, render_probe(self.target), self.target.python,
                                     self.target.image_digest)

    def _running_knobs(self) -> dict | None:
        p = self.ex.root / "_targets" / f"{self.target.name}.station.json"
        return json.loads(p.read_text()) if p.exists() else self.spec.parent_knobs

    async def deploy(self) -> dict:
        assert self.station and self.rendered
        states = [await self.transport.service_state(s) for s in self.rendered.services]
        warm = all(st.alive and st.station == self.service_key(s) for s, st in zip(self.rendered.services, states))
        cost = change_cost(self._running_knobs(), self.station.knobs)
        # a deploy that an earlier invocation of this run began (and crashed in) may have started these very
        # services already: it still counts as this run's restart, and its relayout steps are read back
        resumed = any(r.phase == "deploy" and r.event == "intent" for r in self.recs) and needs_restart(cost)
        if warm and not resumed:
            return {"restarted": False, "cost_class": cost or "none", "reused": self.station.server_hash}
        cost = cost if needs_restart(cost) else "restart"
        steps: list = []
        if self.rendered.relayout:  # a static layout: the target's collect -> fit, then the restart loads it
            cost = "relayout"  # also from a cold start: the engine cannot start without its layout file
            await self.transport.run(["mkdir", "-p", f"{self.target.root_for(None)}/layout"])
            steps = [await self.relayout_step(st.name, st.argv) for st in self.rendered.relayout] + ["load_layout"]
            await self.spread_layout()
        elif cost == "relayout":  # virtual (sim) or undeclared: the restart alone changes the layout
            steps = ["collect_expert_stats", "fit_layout", "load_layout"]
        if warm:  # started by the crashed invocation: do not start it twice
            self.note_running_station()
        else:
            await self.start_services()
        return {"restarted": True, "cost_class": cost, "relayout_steps": steps,
                "services": [s.name for s in self.rendered.services], **({"resumed": True} if warm else {})}

    async def spread_layout(self) -> None:
        """The placement was fitted on the load host; each engine host gets it at the same path."""
        from executor.templates import layout_files

        assert self.station and self.rendered
        path = layout_files(self.target, self.station)["{layout}"]
        load_host = (self.target.host_entry(None) or self.target.hosts[0]).host
        others = sorted({s.host for s in self.rendered.services} - {load_host})
        if not others or self.target.kind == "local":  # local: one machine, the file is already there
            return
        res = await self.transport.run(["cat", path])
        if res.rc != 0:
            raise PhaseFailure("relayout_failed", f"relayout: the fitted layout {path} is missing: {res.stderr[-500:]}")
        for h in others:
            await self.transport.run(["mkdir", "-p", path.rsplit("/", 1)[0]], host=h)
            await self.transport.put_text(path, res.stdout, host=h)

    async def relayout_step(self, name: str, argv: tuple[str, ...]) -> dict:
        """One detached relayout step with its own run directory: launched once, read from its markers."""
        key = f"{self.spec.run_id}.relayout-{name}"
        t0 = time.perf_counter_ns()
        m = await self.retry(lambda: self.transport.poll(key))
        if load_resume_action(m.claimed, m.alive, m.done) == "start":
            try:
                await self.transport.launch_argv(key, list(argv), self.epoch)
            except AlreadyClaimed:
                pass
        m = await self.wait_done(key, f"relayout {name} ({key})")
        if m.rc != 0:
            text = await self.transport.run_log(key)
            raise PhaseFailure("relayout_failed", f"relayout {name} exited rc={m.rc}: {text[-3000:]}")
        return {"name": name, "rc": m.rc, "seconds": (time.perf_counter_ns() - t0) / 1e9}

    async def wait_done(self, key: str, what: str, progress: bool = False):
        """Poll a detached run's markers until done (renewing the lease); a run gone without rc/done is UNKNOWN.
        progress: also note the requests the load has recorded so far (`progress.json`, read by the API and CLI)."""
        while True:
            m = await self.retry(lambda: self.transport.poll(key))
            a = load_resume_action(m.claimed, m.alive, m.done)
            if progress:
                await self.note_progress(key, final=a == "collect")
            if a == "collect":
                return m
            if a == "unknown":
                raise UnknownState(f"{what}: process ended without rc/done markers")
            await self.renew()
            await asyncio.sleep(self.s.poll_interval_s)  # polling a detached process's markers

    async def note_progress(self, key: str, final: bool = False) -> None:
        """Requests done / N of the running load, rewritten atomically, at most once a second (each count is
        a command on the target) and once more when it ended; a failed count is only not shown."""
        if not final and time.monotonic() - self._progress_at < 1.0:
            return
        self._progress_at = time.monotonic()
        try:
            done = await self.transport.requests_done(key)
        except Exception as e:  # a progress figure must never fault the load it describes
            log.debug("progress of %s not counted: %s", key, e)
            return
        rec.write_atomic(self.work / PROGRESS, json.dumps(
            {"requests_done": done, "requests_total": self.spec.n + self.spec.warmup, "at": time.time()}))

    def service_key(self, svc: ServiceSpec) -> str:
        """What a running service is: the station's server hash and its exact rendered launch (argv, env,
        files), so a service started with injected faults or an older template is never reused."""
        assert self.station
        return f"{self.station.server_hash}-{content_hash(svc.model_dump(mode='json'))[:8]}"

    async def start_services(self) -> None:
        """(Re)start every service of the station; the launcher stops a previous instance first."""
        assert self.station and self.rendered
        for i, svc in enumerate(self.rendered.services):
            await self.retry(lambda svc=svc: self.transport.start_service(svc, self.service_key(svc), self.epoch))
            if i == 0:
                crashpoint("deploy", "mid")
        self.note_running_station()

    def note_running_station(self) -> None:
        self.restarted = True
        (self.ex.root / "_targets").mkdir(exist_ok=True)
        rec.write_atomic(self.ex.root / "_targets" / f"{self.target.name}.station.json",
                         json.dumps(self.station.knobs, sort_keys=True, default=str))

    async def health(self) -> dict:
        assert self.rendered
        # our own deadline comes before the phase's outer timeout, so the record says never_healthy, not timeout
        deadline = time.monotonic() + 0.9 * self.s.timeout("health")
        for svc in self.rendered.services:
            while True:
                st = await self.transport.service_state(svc)
                if not st.alive:
                    text = (await self.transport.service_log(svc)).strip()
                    raise PhaseFailure("launch_failure", f"{svc.name} exited during start-up (rc={st.rc}): {text[-3000:]}")
                if await self.transport.health(svc):
                    break
                if getattr(self.transport, "virtual", False) or time.monotonic() > deadline:
                    raise PhaseFailure("never_healthy", f"{svc.name}: {svc.health_path} never answered 200")
                await self.renew()
                await asyncio.sleep(self.s.poll_interval_s)  # polling an external process, bounded by deadline
        return {"healthy": [s.name for s in self.rendered.services]}

    async def warmup(self) -> dict:
        # warm-up requests travel at the head of the load run (excluded from figures), so they share its
        # run-directory claim and can never be sent twice; this phase records the plan, the cache flush
        # a reused service needs before a zero-cache run, and its cost.
        restarted = self.deploy_restarted()
        out: dict[str, Any] = {"warmup_requests": self.spec.warmup, "after_restart": restarted}
        if self.zero_cache and not restarted and getattr(self.transport, "virtual", False):
            out["cache_flush"] = "not needed: every simulated load starts with an empty cache"
        elif self.zero_cache and not restarted:
            out |= await self.flush_caches()
        return out

    async def flush_caches(self) -> dict:
        """Empty every engine's prefix cache; where an engine cannot, restart it (cold = empty)."""
        from executor.cacheflush import cache_holders, flush_service

        assert self.rendered
        done = [await self.retry(lambda s=s: flush_service(self.transport, s, self.target.engine))
                for s in cache_holders(self.rendered.services)]
        if all(d["ok"] for d in done):
            return {"cache_flush": done}
        log.warning("run %s: prefix cache flush refused (%s); restarting for a cold cache", self.spec.run_id, done)
        await self.start_services()
        await self.health()
        return {"cache_flush": done, "cache_flush_fallback": "restart"}

    def deploy_restarted(self) -> bool:
        recs = [as_record(r) for r in self.ex.store.phases(self.spec.run_id)]
        return any(r.phase == "deploy" and r.event == "outcome" and r.status == "ok" and (r.detail or {}).get("restarted")
                   for r in recs)

    def plan(self) -> LoadPlan:
        assert self.station and self.rendered
        k = self.station.knobs
        return LoadPlan(endpoint=self.rendered.endpoint, scenario=self.spec.scenario, n=self.spec.n,
                        warmup=self.spec.warmup, concurrency=int(k["concurrency"]), request_rate=float(k["request_rate"]),
                        seed=self.spec.seed, knobs=k, faults=tuple(self.spec.faults), metrics=self.rendered.metrics,
                        cards=self.cards)

    async def load_phase(self) -> dict:
        key = f"{self.spec.run_id}.load"
        if "load" in self.ok_before:
            m = await self.transport.poll(key)
            return {"resumed": "recorded", "rc": m.rc}
        return await self.phase("load", lambda: self.load(key), intent={"key": key})

    async def load(self, key: str) -> dict:
        m = await self.retry(lambda: self.transport.poll(key))
        action = load_resume_action(m.claimed, m.alive, m.done)
        started = False
        if action == "start":
            try:
                await self.transport.launch(key, self.plan(), self.epoch)
                started = True
            except AlreadyClaimed:
                pass  # claimed between our poll and launch: it is running; read its markers
            crashpoint("load", "mid")
        elif action == "unknown":
            raise UnknownState(f"load {key}: run directory claimed but its process is gone without rc/done markers")
        t_wait = time.monotonic()
        m = await self.wait_done(key, f"load {key}", progress=True)
        dest = self.work / "load"
        await self.retry(lambda: self.transport.fetch(key, dest))
        if "stats_failure" in self.spec.faults and self.target.kind != "sim" and started:
            (dest / "fault_stats_failure").write_text("injected\n")
        if m.rc not in (0, None) and not (dest / rec.REQUESTS).exists():
            text = await self.transport.run_log(key)
            raise PhaseFailure("load_failed", f"load exited rc={m.rc} without sending: {text[-3000:]}")
        return {"rc": m.rc, "started_here": started, "resumed_action": action,
                "waited_s": round(time.monotonic() - t_wait, 3)}

    async def profile(self) -> dict:
        """Sim: the time breakdown of the run. Real targets: a short profiler window, summary only."""
        br = self.work / "load" / rec.BREAKDOWN
        if self.target.kind == "sim" and br.exists():
            return {"summary": json.loads(br.read_text()), "source": "simulator breakdown"}
        return await profile_window(self.transport, self.rendered, self.target.profiler_seconds, self.target.python)

    async def collect_and_validate(self, prep: dict, load: dict, profile: dict | None) -> TrialResult:
        from executor.collect import CollectionError, summarize_run

        run_dir = self.work / "load"
        summary: Summary | None = None
        verdict: Verdict | None = None
        error = None
        for attempt in range(1, self.s.collect_attempts + 1):
            async def _collect() -> dict:
                nonlocal summary, verdict
                try:
                    summary, verdict = summarize_run(run_dir)
                except CollectionError as e:
                    raise PhaseFailure("collection_fault", str(e)) from None
                return {"attempt": attempt, "verdict": verdict.kind}
            try:
                await self.phase("collect", _collect, intent={"attempt": attempt, "from": "raw data"})
                break
            except PhaseFailure as e:
                error = str(e)
        if verdict is None:
            verdict = Verdict(kind="collection_fault", reasons=[Reason(code="statistics_failed", message=error or "")])
        healthy = await self.healthy_after()
        if not healthy and verdict.kind != "valid" and self.target.kind != "sim":
            died = await self.dead_service_text()
            if died:  # a server that died mid-run is a tooling fault with its own words, never a slow result
                verdict = Verdict(kind="orchestration_fault", reasons=[Reason(code="server_died", message=died)])
                error = died
        evidence = _read_json(run_dir / "evidence.json") or {}
        info = _read_json(run_dir / rec.RUN_INFO) or {}
        if evidence and "error" not in evidence and self.station is not None and "knobs" not in info:
            # a real load's run.json carries no knobs: limits the digest reads (batch limit) come from the station
            from executor.evidence import digest_run

            evidence = digest_run(run_dir, rec.RunInfo.model_validate(info), self.station.knobs)
        if profile:
            evidence = evidence | {"profile": profile.get("summary")}
        self.cards = int(info.get("cards") or self.cards)
        self.charge(summary)

        async def _validate() -> dict:
            return {"verdict": verdict.kind, "reasons": [r.code for r in verdict.reasons], "healthy_after": healthy}
        await self.phase("validate", _validate)
        return TrialResult(run_id=self.spec.run_id, verdict=verdict, summary=summary, evidence=evidence,
                           costs=self.costs, run_dir=str(run_dir), station_hash=prep.get("station_hash"),
                           source_identity=prep.get("source_identity"), data_version=prep.get("data_version"),
                           healthy_after=healthy, failed_phase={"collection_fault": "collect", "orchestration_fault": "load"}.get(verdict.kind),
                           error=error if verdict.kind in ("collection_fault", "orchestration_fault") else None)

    async def dead_service_text(self) -> str | None:
        """'<service> exited (rc=..) during the run: <its log tail>' for the first dead service, else None."""
        for svc in (self.rendered.services if self.rendered else ()):
            st = await self.transport.service_state(svc)
            if not st.alive:
                text = (await self.transport.service_log(svc)).strip()
                return f"{svc.name} exited (rc={st.rc}) during the run: {text[-3000:]}"
        return None

    async def healthy_after(self) -> bool:
        if not self.rendered:
            return False
        for svc in self.rendered.services:
            st = await self.transport.service_state(svc)
            if not st.alive or not await self.transport.health(svc):
                return False
        return True

    # -- costs, faults, retries ----------------------------------------------------------------------
    def charge(self, summary: Summary | None) -> None:
        recs = [as_record(r) for r in self.ex.store.phases(self.spec.run_id)]
        dep = next((r.detail or {} for r in recs if r.phase == "deploy" and r.event == "outcome" and r.status == "ok"), {})
        load = next((r.detail or {} for r in recs if r.phase == "load" and r.event == "outcome" and r.status == "ok"), {})
        c = self.cards
        prof = None
        if self.target.engine == "sim":
            from simulator import profiles
            prof = profiles.load(self.target.profile).costs
        measured = sum(st.get("seconds", 0.0) for st in dep.get("relayout_steps", []) if isinstance(st, dict))
        if dep.get("restarted"):
            restart_s = prof.restart_s if prof else max(0.0, dep.get("seconds", 0.0) - measured)
            self.costs.append(CostEntry(what="restart", seconds=restart_s, cards=c))
            if prof:
                self.costs.append(CostEntry(what="weight_load", seconds=prof.weight_load_s, cards=c))
                self.costs.append(CostEntry(what="warmup", seconds=prof.warmup_s, cards=c))
            if dep.get("cost_class") == "relayout":
                self.costs.append(CostEntry(what="relayout", seconds=prof.relayout_s if prof else measured, cards=c))
        if prof is not None and summary is not None and summary.whole is not None:
            load_s = summary.whole.end  # virtual seconds from the first send to the last completion
        else:
            load_s = float(load.get("seconds", 0.0))
        self.costs.append(CostEntry(what="load", seconds=load_s, cards=c))
        if self.spec.profile_capture:
            self.costs.append(CostEntry(what="profile", seconds=self.target.profiler_seconds, cards=c))

    def fault_result(self, phase: str, kind: str, code: str, message: str, prep: dict | None = None) -> TrialResult:
        return TrialResult(run_id=self.spec.run_id, verdict=Verdict(kind=kind, reasons=[Reason(code=code, message=message)]),
                           costs=self.costs, station_hash=(prep or {}).get("station_hash"),
                           source_identity=(prep or {}).get("source_identity"),
                           data_version=(prep or {}).get("data_version"), healthy_after=False,
                           failed_phase=phase, error=message)

    async def retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Bounded retry of transient transport errors, only around steps that are safe to repeat."""
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.s.transient_attempts),
                                           wait=wait_exponential(multiplier=0.2, max=5.0),
                                           retry=retry_if_exception_type(Transient), reraise=True):
            with attempt:
                return await fn()


def render_probe(target: Target) -> ServiceSpec:
    """The engine service whose identity we record: the first one (prefill, or the only one)."""
    from executor.templates import RENDERERS

    dummy = Station(engine=target.engine, knobs={}, scenario="-", data_version="-", source_identity="-", target=target.name)
    return RENDERERS[target.template or target.engine](target, dummy).services[0]


def _unknown_result(spec: TrialSpec, why: str) -> TrialResult:
    v = Verdict(kind="orchestration_fault", reasons=[Reason(code="unknown_state", message=f"UNKNOWN: {why}")])
    return TrialResult(run_id=spec.run_id, verdict=v, healthy_after=False, failed_phase="load", error=f"UNKNOWN: {why}")


def dump_result(result: TrialResult) -> str:
    """JSON that keeps inf (an infinite request rate) as Infinity, so the file round-trips."""
    return json.dumps(result.model_dump(mode="python"), indent=1, default=str)


def load_result(p: Path) -> TrialResult:
    return TrialResult.model_validate(json.loads(p.read_text()))


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


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

