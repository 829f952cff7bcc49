"""Deploy-side phases of a trial: prepare (freeze and render the station), deploy, health, warm-up.

A mixin of executor.trialrun.TrialRun: `self` carries the spec, target, transport, journal and lease.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from core import records as rec
from core import scenarios
from core.knobs import KnobError
from core.station import Station, change_cost, content_hash, full_knobs, needs_restart
from executor.phases import PhaseFailure, crashpoint, load_resume_action
from executor.templates import ENGINE_KEY, ServiceSpec, render, service_layout
from executor.transports.base import PROBE_S, AlreadyClaimed

log = logging.getLogger("tuneloop.executor")


class DeployPhases:
    async def prepare(self) -> dict:

        engine_key = ENGINE_KEY[self.target.engine]
        try:
            knobs = full_knobs(self.spec.knobs, engine_key)
            scenario = scenarios.load(self.spec.scenario)
        except (KnobError, FileNotFoundError, ValueError) as e:
            raise PhaseFailure("invalid_station", str(e)) from None
        self.zero_cache = scenario.zero_cache
        source = await self.transport.source_identity()
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
        # the clock this run's device time is kept in (progress shows one clock: the simulator's virtual seconds)
        clock = "simulated" if getattr(self.transport, "virtual", False) else "wall"
        return {"station_hash": self.station.hash, "server_hash": self.station.server_hash, "source_identity": source,
                "data_version": scenario.data_version, "services": [s.name for s in self.rendered.services],
                "clock": clock}

    def _parent_knobs(self) -> dict | None:
        """The warm service's station as the spec names it, with the engine's defaults filled in like the station."""
        if self.spec.parent_knobs is None:
            return None
        try:
            return full_knobs(self.spec.parent_knobs, ENGINE_KEY[self.target.engine])
        except KnobError:
            return dict(self.spec.parent_knobs)

    async def deploy(self) -> dict:
        assert self.station and self.rendered
        states = [await self.transport.service_state(s) for s in self.rendered.services]
        warm = all(st.alive and st.station == self.service_key(s) for s, st in zip(self.rendered.services, states))
        # the warm station is the spec's parent_knobs, which the planner takes from the store's history (the one
        # source of truth); the executor keeps no file of its own. Whether the running services ARE this station
        # is read from the target itself (service_key), never assumed.
        cost = change_cost(self._parent_knobs(), self.station.knobs)
        notes = self.deploy_warnings()
        # a deploy that an earlier invocation of this run began (and crashed in) may have started these very
        # services already: it still counts as this run's restart, and its relayout steps are read back
        resumed = self.journal.began_before("deploy") and needs_restart(cost)
        if warm and not resumed:  # with no parent named, the running server IS this station: at most a hot change
            cls = (cost or "none") if self.spec.parent_knobs is not None else "hot"
            return {"restarted": False, "cost_class": cls, "reused": self.station.server_hash, **notes}
        cost = cost if needs_restart(cost) else "restart"
        steps: list = []
        if self.rendered.relayout:  # a static layout: the target's collect -> fit, then the restart loads it
            cost = "relayout"  # also from a cold start: the engine cannot start without its layout file
            await self.transport.run(["mkdir", "-p", f"{self.target.root_for(None)}/layout"])
            steps = [await self.relayout_step(st.name, st.argv) for st in self.rendered.relayout] + ["load_layout"]
            maps: dict[str, list[ServiceSpec]] = {}  # one fitted map per role and rank count, to its own engines
            for svc in self.rendered.services:
                if svc.role != "router":
                    maps.setdefault(service_layout(self.target, self.station, svc)["{layout}"], []).append(svc)
            for path, svcs in maps.items():
                await self.transport.spread_file(path, svcs)
        elif cost == "relayout":  # virtual or undeclared: the restart alone changes the layout
            steps = ["collect_expert_stats", "fit_layout", "load_layout"]
        if not warm:  # else started by the crashed invocation: do not start it twice
            await self.start_services()
        return {"restarted": True, "cost_class": cost, "relayout_steps": steps,
                "services": [s.name for s in self.rendered.services], **({"resumed": True} if warm else {}), **notes}

    def deploy_warnings(self) -> dict:
        """What the rendering says the operator must still provide (e.g. vLLM-Ascend PD's network interfaces):
        logged, and kept in the deploy outcome's detail as `warnings`, so the run's record shows what this
        deployment left to the operator. Absent when there is none; never a refusal."""
        assert self.rendered
        for w in self.rendered.warnings:
            log.warning("run %s: %s", self.spec.run_id, w)
        return {"warnings": list(self.rendered.warnings)} if self.rendered.warnings else {}

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

    async def health(self) -> dict:
        assert self.rendered
        # our own deadline comes before the phase's outer timeout, so the record says never_healthy, not timeout:
        # it leaves room for the last probe (a state query and a health request of up to PROBE_S on busy cores)
        limit = self.s.timeout("health")
        deadline = time.monotonic() + max(0.5 * limit, min(0.9 * limit, limit - PROBE_S))
        for svc in self.rendered.services:
            await self.transport.until_healthy(svc, deadline, self.renew, self.s.poll_interval_s)
        return {"healthy": [s.name for s in self.rendered.services]}

    async def warmup(self) -> dict:
        # warm-up requests travel at the head of the load run (excluded from figures), so they share its
        # run-directory claim and can never be sent twice; this phase records the plan, the cache flush
        # a reused service needs before a zero-cache run, and its cost.
        restarted = bool(self.journal.ok_detail("deploy").get("restarted"))
        out: dict[str, Any] = {"warmup_requests": self.spec.warmup, "after_restart": restarted}
        if self.zero_cache and not restarted:
            out |= await self.flush_caches()
        return out

    async def flush_caches(self) -> dict:
        """Empty every engine's prefix cache; where an engine cannot, restart it (cold = empty)."""
        assert self.rendered
        done = await self.retry(lambda: self.transport.flush_prefix_caches(self.rendered.services))
        if done.get("ok", True):
            return {"cache_flush": done["cache_flush"]}
        log.warning("run %s: prefix cache flush refused (%s); restarting for a cold cache", self.spec.run_id, done)
        await self.start_services()
        await self.health()
        return {"cache_flush": done["cache_flush"], "cache_flush_fallback": "restart"}
