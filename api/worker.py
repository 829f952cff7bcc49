"""A worker: claim a goal from the work queue, run the loop until it stops or waits, give it back.

The claim is heartbeated while the loop runs; a killed worker's claim expires and another worker
(or the restarted service) picks the goal up, and the store-backed loop continues where it was.
Each worker has its own executor holder name, so the per-target lease tells workers apart.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from state.workqueue import Claim

if TYPE_CHECKING:
    from api.service import Service

log = logging.getLogger("tuneloop.worker")


class Worker:
    def __init__(self, service: "Service", name: str):
        self.svc, self.name = service, name
        self.settings = service.settings

    def run_forever(self) -> None:
        stop = self.svc.stop_event
        while not stop.is_set():
            try:
                claim = self.svc.store.claim(self.name, self.settings.claim_ttl_s, list(self.settings.worker_targets))
            except Exception as e:  # the database is briefly unreachable: try again after the poll interval
                log.warning("worker %s: claim failed: %s", self.name, type(e).__name__)
                claim = None
            if claim is None:
                stop.wait(self.settings.poll_s)  # nothing to do: poll the queue again
                continue
            self.run_claim(claim)

    def run_claim(self, claim: Claim) -> Any:
        beat_stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(claim, beat_stop), daemon=True)
        beat.start()
        try:
            return self._run(claim)
        except Exception as e:
            log.exception("worker %s: goal %s failed", self.name, claim.goal_id)
            self.svc.notifier.notify("stopped", claim.goal_id, f"worker error: {type(e).__name__}: {e}")
            return None
        finally:
            beat_stop.set()
            beat.join()
            self.svc.store.finish(claim)

    def _heartbeat(self, claim: Claim, stop: threading.Event) -> None:
        while not stop.wait(self.settings.claim_ttl_s / 3):
            if not self.svc.store.heartbeat(claim, self.settings.claim_ttl_s):
                log.warning("worker %s: lost its claim on %s", self.name, claim.goal_id)
                return

    def _run(self, claim: Claim) -> Any:
        from agent.session import make_planner, run_session
        from executor.phases import ExecSettings
        from executor.runner import Executor

        store, s = self.svc.store, self.settings
        goal = store.get_goal(claim.goal_id)
        ex = Executor(store, self.svc.targets, ExecSettings.from_env(holder=f"{self.name}:executor",
                                                                      runs_root=s.runs_root))
        planner = make_planner(s.llm_base_url, s.llm_model,
                               s.llm_api_key.get_secret_value() if s.llm_api_key else None)
        res = run_session(goal.spec, store.url, goal_id=goal.id, executor=ex, planner=planner,
                          who=f"worker {self.name}", on_event=self._events(goal.id))
        if res.status == "waiting" and res.waiting_for:
            w = res.waiting_for
            card = w.get("card") or {}
            ch = card.get("change")
            what = f"{ch['knob']} {ch['old']} -> {ch['new']}" if ch else "reference run"
            self.svc.notifier.notify(
                "approval_needed", goal.id,
                f"candidate {w['candidate_id']} needs approval: {card.get('stage')} N={card.get('n')} {what} "
                f"[{card.get('cost_class')}], card hash {w['card_hash']} ({w.get('why')})",
                {"candidate_id": w["candidate_id"], "card_hash": w["card_hash"], "card": card})
        elif res.status in ("done", "stopped", "paused"):
            self.svc.notifier.notify("stopped", goal.id, f"loop {res.status}: {res.reason}",
                                     {"status": res.status, "reason": res.reason})
        return res

    def _events(self, goal_id: str) -> Any:
        def on_event(phase: str, info: dict[str, Any]) -> None:
            if phase == "judge":
                card = info.get("card") or {}
                self.svc.notifier.notify("decision", goal_id, str(info.get("reason", "")),
                                         {"outcome": info.get("outcome"), "run_id": card.get("run_id"),
                                          "experiment_key": card.get("experiment_key")})
        return on_event
