"""Collect and validate: raw records -> summary + verdict against the goal's contract, costs, the result.

A mixin of executor.trialrun.TrialRun. The contract travels with the TrialSpec; the cards in use come from
what the transport launched, never from the record being checked.
"""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from core import records as rec
from core.evidence import Evidence
from core.evidence_parts import profile_of
from core.summary import Reason, Summary, Verdict
from core.trial import TrialResult
from executor.collect import VERDICT, CollectionError, summarize_run
from executor.drift import drift_check
from executor.evidence import digest_run
from executor.phases import PhaseFailure
from executor.verdict import handoff_fault

FAILED_PHASE = {"collection_fault": "collect", "orchestration_fault": "load"}
ENGINE_LOGS = "engine-logs"  # beside a faulted run's records: each service's own log since its last start
LOG_TAIL_BYTES = 1 << 20
# a line in an engine's log that names a failure: its level, a traceback, or a warning that says something failed
# (a start-up warning that merely names the KV connector, "Initializing KVConnectorBase_V1 ...", is not one)
CAUSE = re.compile(r"(?-i:\b(ERROR|CRITICAL)\b|Traceback)"  # the level as the engines write it
                   r"|(?-i:\bWARNING\b).*\b(fail|expir|timed? ?out|abort|refus|mismatch|lost)", re.I)
CAUSE_LINES = 3


class CollectPhases:
    async def collect_and_validate(self, prep: dict, profile: dict | None) -> TrialResult:
        run_dir = self.work / "load"
        cards = self.transport.cards_in_use(self.rendered, self.station.knobs) if self.station and self.rendered else None
        summary: Summary | None = None
        verdict: Verdict | None = None
        error = None
        for attempt in range(1, self.s.collect_attempts + 1):
            async def _collect() -> dict:
                nonlocal summary, verdict
                try:
                    summary, verdict = summarize_run(run_dir, slos=self.spec.slos, contract=self.spec.contract,
                                                     cards_in_use=cards)
                except CollectionError as e:
                    raise PhaseFailure("collection_fault", str(e)) from None
                return {"attempt": attempt, "verdict": verdict.kind, "cards_in_use": cards}
            try:
                await self.phase("collect", _collect, intent={"attempt": attempt, "from": "raw data"})
                break
            except PhaseFailure as e:
                error = str(e)
        if verdict is None:
            verdict = Verdict(kind="collection_fault", reasons=[Reason(code="statistics_failed", message=error or "")])
        healthy = await self.healthy_after()
        if not healthy and verdict.kind != "valid":
            died = await self.died_text()
            if died:  # a server that died mid-run is a tooling fault with its own words, never a slow result
                verdict = Verdict(kind="orchestration_fault", reasons=[Reason(code="server_died", message=died)])
                error = died
        evidence = self.evidence(run_dir)
        if verdict.kind != "orchestration_fault" and (handoff := handoff_fault(evidence)) is not None:
            verdict, error = handoff, handoff.reasons[0].message
        if verdict.kind == "orchestration_fault":  # the engines' own words kept beside the run, the cause named
            said = await self.keep_engine_logs(run_dir)
            if said:
                r = verdict.reasons[0]
                verdict = verdict.model_copy(update={"reasons": [
                    r.model_copy(update={"message": f"{r.message}; the engines said: {said}"}), *verdict.reasons[1:]]})
                error = verdict.reasons[0].message
            rec.write_atomic(run_dir / VERDICT, verdict.model_dump_json(indent=1))  # the run directory agrees
        if profile:
            evidence = evidence.model_copy(update={"profile": profile_of(profile.get("summary"))})
        drift = drift_check(self.target, self.spec, summary, str(run_dir)) if verdict.kind == "valid" else None
        if drift is not None:  # a real run of a target with a calibrated profile: the simulator predicted it too
            evidence = evidence.model_copy(update={"drift": drift})
        self.costs = self.transport.costs(self.journal.ok_detail("deploy"), self.journal.ok_detail("load"), summary,
                                          cards or self.target.cards or 1, self.spec.profile_capture)

        async def _validate() -> dict:
            return {"verdict": verdict.kind, "reasons": [r.code for r in verdict.reasons], "healthy_after": healthy}
        await self.phase("validate", _validate)
        return TrialResult(run_id=self.spec.run_id, verdict=verdict, summary=summary, evidence=evidence,
                           costs=self.costs, run_dir=str(run_dir), station_hash=prep.get("station_hash"),
                           source_identity=prep.get("source_identity"), data_version=prep.get("data_version"),
                           healthy_after=healthy, failed_phase=FAILED_PHASE.get(verdict.kind),
                           error=error if verdict.kind in FAILED_PHASE else None)

    def evidence(self, run_dir: Path) -> Evidence:
        raw = _read_json(run_dir / "evidence.json") or {}
        info = _read_json(run_dir / rec.RUN_INFO) or {}
        if raw and raw.get("error") is None and self.station is not None and "knobs" not in info:
            # a real load's run.json carries no knobs: limits the digest reads (batch limit) come from the station
            return digest_run(run_dir, rec.RunInfo.model_validate(info), self.station.knobs)
        return Evidence.model_validate(raw)

    async def died_text(self, grace_s: float = 10.0, every_s: float = 0.5) -> str | None:
        """The words of a service that died during the run, or None. The launcher's wrapper shell outlives its
        engine by the moment it takes to write rc and done (longer on a busy host), so a service that fails its
        health check but still reads alive is asked again for up to grace_s."""
        services = self.rendered.services if self.rendered else ()
        loop = asyncio.get_running_loop()
        until = loop.time() + grace_s
        while True:
            died = await self.transport.dead_service_text(services)
            if died or loop.time() >= until or not await self._alive_but_unhealthy(services):
                return died
            await asyncio.sleep(every_s)

    async def _alive_but_unhealthy(self, services: Any) -> bool:
        for svc in services:
            if (await self.transport.service_state(svc)).alive and not await self.transport.health(svc):
                return True
        return False

    async def keep_engine_logs(self, run_dir: Path) -> str:
        """Each service's log since its last start (its last MiB) written to run_dir/engine-logs/NAME.log, and the
        first lines in them that name a failure, `NAME: line`, joined (empty when none does). A log that cannot be
        read is named in its file instead; the fault stands either way."""
        services = self.rendered.services if self.rendered else ()
        out = run_dir / ENGINE_LOGS
        causes: list[tuple[bool, str]] = []  # (a warning only, 'NAME: line')
        for svc in services:
            try:
                text = await self.transport.service_log(svc, tail=LOG_TAIL_BYTES)
            except Exception as e:  # noqa: BLE001 - a log we cannot read is named, never fatal to the record
                text = f"(the log of {svc.name} could not be read: {e!r})\n"
            out.mkdir(parents=True, exist_ok=True)
            rec.write_atomic(out / f"{svc.name}.log", text)
            causes += [(m.group(1) is None and "Traceback" not in m.group(0), f"{svc.name}: {line.strip()[:300]}")
                       for line in text.splitlines() if (m := CAUSE.search(line))]
        causes.sort(key=lambda c: c[0])  # errors and tracebacks first (a warning at start-up is the least of them)
        return " | ".join(c for _, c in causes[:CAUSE_LINES])

    async def healthy_after(self) -> bool:
        if not self.rendered:
            return False
        for svc in self.rendered.services:
            st = await self.transport.service_state(svc)
            if not st.alive or not await self.transport.health(svc):
                return False
        return True

    def fault_result(self, phase: str, kind: str, code: str, message: str, prep: dict | None = None) -> TrialResult:
        return TrialResult(run_id=self.spec.run_id, verdict=Verdict(kind=kind, reasons=[Reason(code=code, message=message)]),
                           costs=self.costs, station_hash=(prep or {}).get("station_hash"),
                           source_identity=(prep or {}).get("source_identity"),
                           data_version=(prep or {}).get("data_version"), healthy_after=False,
                           failed_phase=phase, error=message)


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
