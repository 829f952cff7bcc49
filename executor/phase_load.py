"""Load-side phases of a trial: the load (one detached run per trial, read from its markers) and profile.

A mixin of executor.trialrun.TrialRun. The load is identified by its run directory on the target: the
launcher's mkdir claim makes a second launch impossible, so a resumed run reads the markers, never guesses.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from core import records as rec
from executor.phases import PhaseFailure, UnknownState, crashpoint, load_resume_action
from executor.transports.base import AlreadyClaimed, LoadPlan

log = logging.getLogger("tuneloop.executor")
PROGRESS = "progress.json"  # requests done / N of the running load (the API and `tuneloop run` show it)


class LoadPhases:
    @property
    def load_key(self) -> str:
        return f"{self.spec.run_id}.load"

    def plan(self) -> LoadPlan:
        assert self.station and self.rendered
        k = self.station.knobs
        return LoadPlan(endpoint=self.rendered.endpoint, scenario=self.spec.scenario, n=self.spec.n,
                        warmup=self.spec.warmup, concurrency=int(k["concurrency"]), request_rate=float(k["request_rate"]),
                        seed=self.spec.seed, knobs=k, faults=tuple(self.spec.faults), metrics=self.rendered.metrics,
                        cards=self.transport.cards_in_use(self.rendered, k))

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
        a command on the target) and once more when it ended; a failed count is only not shown. A target with
        a clock of its own (the simulator's virtual time) adds it: `elapsed_s` is then the device seconds it
        charges so far (restart and warm-up as the deploy did them, plus the load), the clock the planner's
        estimate is in, never mixed with the wall's."""
        if not final and time.monotonic() - self._progress_at < 1.0:
            return
        self._progress_at = time.monotonic()
        try:
            done = await self.transport.requests_done(key)
            clock = await self.transport.load_clock(key) if hasattr(self.transport, "load_clock") else None
            note = {"requests_done": done, "requests_total": self.spec.n + self.spec.warmup, "at": time.time(),
                    "clock": "wall"}
            if clock is not None:
                before = sum(c.seconds for c in self.transport.costs(self.journal.ok_detail("deploy"), {}, None, 1,
                                                                     False) if c.what != "load")
                note |= {"clock": "simulated", "load_s": clock, "elapsed_s": round(before + clock, 3)}
        except Exception as e:  # a progress figure must never fault the load it describes
            log.debug("progress of %s not counted: %s", key, e)
            return
        rec.write_atomic(self.work / PROGRESS, json.dumps(note))

    async def load(self) -> dict:
        key = self.load_key
        m = await self.retry(lambda: self.transport.poll(key))
        action = load_resume_action(m.claimed, m.alive, m.done)
        started = False
        if action == "start":
            try:
                await self._launch_counting(key)
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
        if m.rc not in (0, None) and not (dest / rec.REQUESTS).exists():
            text = await self.transport.run_log(key)
            raise PhaseFailure("load_failed", f"load exited rc={m.rc} without sending: {text[-3000:]}")
        return {"rc": m.rc, "started_here": started, "resumed_action": action,
                "waited_s": round(time.monotonic() - t_wait, 3)}

    async def _launch_counting(self, key: str) -> None:
        """Launch the load, noting its progress while the launch itself runs: a real target's launch returns at
        once (the load is detached), the simulator's is the whole simulated load, whose count would else stand
        at 0 until it ended. The first count waits a second: a launch that returns by then is never counted over."""
        launch = asyncio.ensure_future(self.transport.launch(key, self.plan(), self.epoch))
        try:
            while not launch.done():
                await asyncio.wait({launch}, timeout=1.0)
                if not launch.done():
                    await self.note_progress(key)
        finally:
            if not launch.done():  # this phase was cancelled: so is the launch, as when it was awaited directly
                launch.cancel()
        launch.result()  # its exception (AlreadyClaimed, a launch failure) as if awaited directly

    async def profile(self) -> dict:
        """The run's time breakdown: the transport knows where it comes from (a simulated breakdown, or a
        short profiler window on the engine whose trace is analysed on the target, summary only)."""
        return await self.transport.profile(self.work / "load", self.rendered)
