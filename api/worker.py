"""A worker: claim a goal from the work queue, run the loop until it stops or waits, give it back.

The claim is heartbeated while the loop runs; a killed worker's claim expires and another worker
(or the restarted service) picks the goal up, and the store-backed loop continues where it was.
Each worker has its own executor holder name, so the per-target lease tells workers apart.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Protocol

from tenacity import RetryCallState, Retrying, stop_after_attempt, wait_exponential

from agent.planner import change_words
from agent.loop.session import make_planner, run_session
from api.failures import describe, failure_reason, is_transient
from api.settings import Settings
from api.webhooks import Notifier
from executor.phases import ExecSettings
from executor.runner import Executor
from state.lifecycle import GoalStatus
from state.statefile import write_state
from state.workqueue import Claim, QueueStore


class Service(Protocol):
    """What a worker reads of the running service (api.service.Service; named here, not imported, so the service
    that starts its workers and the workers do not import each other)."""

    settings: Settings
    store: QueueStore
    notifier: Notifier
    targets: dict[str, Any]
    stop_event: threading.Event
    session: Callable[..., Any] | None
    nudge: threading.Event


log = logging.getLogger("tuneloop.worker")


class Worker:
    """`session` is the loop's entry point (agent.loop.session.run_session); a test may wrap it to inject faults."""

    def __init__(self, service: "Service", name: str, session: Callable[..., Any] | None = None):
        self.svc, self.name = service, name
        self.settings = service.settings
        self.session = session or service.session or _run_session
        self.attempts = 0
        self._seen = float("-inf")

    def _present(self, now: float) -> None:
        """Write this worker's presence at most every third of a claim's TTL (what /health counts)."""
        if now - self._seen < self.settings.claim_ttl_s / 3:
            return
        try:
            self.svc.store.present(self.name, os.getpid())
            self._seen = now
        except Exception as e:  # presence is for people reading /health: never stop a worker for it
            log.warning("worker %s: presence not written: %s", self.name, type(e).__name__)

    def run_forever(self) -> None:
        stop = self.svc.stop_event
        try:
            self._poll(stop)
        finally:
            try:
                self.svc.store.absent(self.name)
            except Exception:  # the store is gone: the row ages out
                pass

    def _poll(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._present(time.monotonic())
            try:
                claim = self.svc.store.claim(self.name, self.settings.claim_ttl_s, list(self.settings.worker_targets))
            except Exception as e:  # the database is briefly unreachable: try again after the poll interval
                log.warning("worker %s: claim failed: %s", self.name, type(e).__name__)
                claim = None
            if claim is None:  # nothing to do: sleep until a person's action here nudges us, or poll again
                if self.svc.nudge.wait(self.settings.poll_s):
                    self.svc.nudge.clear()
                continue
            try:
                self.run_claim(claim)
            except Exception as e:  # never let one goal end the worker thread (e.g. the store vanished mid-give-back)
                log.warning("worker %s: giving %s back failed: %s", self.name, claim.goal_id, describe(e))

    def run_claim(self, claim: Claim) -> Any:
        """Run the goal's loop under a heartbeated claim: transient errors are retried (bounded), anything
        else (or a transient error that persists) leaves the goal `failed` with the error, until a person
        resumes it."""
        beat_stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(claim, beat_stop), daemon=True)
        beat.start()
        failed: str | None = None
        try:
            return self._retrying(claim)
        except Exception as e:
            if not self._still_mine(claim):
                log.warning("worker %s: %s failed after losing its claim; the new holder carries on", self.name,
                            claim.goal_id)
                return None
            log.exception("worker %s: goal %s failed", self.name, claim.goal_id)
            failed = self._record_failure(claim, e)
            return None
        finally:
            beat_stop.set()
            beat.join()
            if failed is None:
                self.svc.store.finish(claim)
            else:
                self.svc.store.fail(claim)

    def _retrying(self, claim: Claim) -> Any:
        s, stop = self.settings, self.svc.stop_event
        self.attempts = 0

        def retry_if(state: RetryCallState) -> bool:
            e = state.outcome.exception() if state.outcome else None
            return e is not None and is_transient(e) and not stop.is_set() and self._still_mine(claim)

        def before_sleep(state: RetryCallState) -> None:
            e = state.outcome.exception() if state.outcome else None
            log.warning("worker %s: goal %s: transient %s (attempt %d of %d); retrying", self.name, claim.goal_id,
                        describe(e) if e else "?", state.attempt_number, s.loop_attempts)

        for attempt in Retrying(stop=stop_after_attempt(s.loop_attempts), retry=retry_if, reraise=True,
                                wait=wait_exponential(multiplier=s.retry_wait_s, max=30), before_sleep=before_sleep,
                                sleep=stop.wait):
            with attempt:
                self.attempts = attempt.retry_state.attempt_number
                return self._run(claim)
        return None  # not reached: the last attempt returns or raises

    def _still_mine(self, claim: Claim) -> bool:
        """Extend the claim; False only when another worker holds the goal now (unknown counts as mine)."""
        try:
            return self.svc.store.heartbeat(claim, self.settings.claim_ttl_s)
        except Exception:  # the store is unreachable: nobody else can have claimed it through it either
            return True

    def _record_failure(self, claim: Claim, e: Exception) -> str:
        """Goal stopped with a `failed: …` reason, a stop decision, STATE.md rewritten, a webhook; the reason."""

        st = self.svc.store
        reason = failure_reason(describe(e), self.attempts, self.name, is_transient(e))
        try:
            goal = st.get_goal(claim.goal_id)
            if goal.status != GoalStatus.DONE:
                st.set_goal_status(goal.id, "stopped", reason)
            st.record_decision(goal.id, "stop", text=reason,
                               data={"status": "failed", "error": describe(e), "attempts": self.attempts,
                                     "transient": is_transient(e), "worker": self.name})
            write_state(st, goal.id, runs_root=self.settings.runs_root)
        except Exception as e2:  # the store itself is down: the work item still says failed once it is back
            log.warning("worker %s: could not record the failure of %s: %s", self.name, claim.goal_id, describe(e2))
        self.svc.notifier.notify("stopped", claim.goal_id, f"loop {reason}",
                                 {"status": "failed", "error": describe(e), "attempts": self.attempts})
        return reason

    def _heartbeat(self, claim: Claim, stop: threading.Event) -> None:
        while not stop.wait(self.settings.claim_ttl_s / 3):
            self._present(time.monotonic())
            if not self._still_mine(claim):
                log.warning("worker %s: lost its claim on %s", self.name, claim.goal_id)
                return

    def _run(self, claim: Claim) -> Any:

        store, s = self.svc.store, self.settings
        goal = store.get_goal(claim.goal_id)
        ex = Executor(store, self.svc.targets, ExecSettings.from_env(holder=f"{self.name}:executor",
                                                                      runs_root=s.runs_root))
        planner = make_planner(s.llm_base_url, s.llm_model,
                               s.llm_api_key.get_secret_value() if s.llm_api_key else None)
        res = self.session(goal.spec, store.url, goal_id=goal.id, executor=ex, planner=planner,
                          who=f"worker {self.name}", on_event=self._events(goal.id))
        if res.status == GoalStatus.WAITING and res.waiting_for and res.waiting_for.get("kind") == "budget_extension":
            w = res.waiting_for
            self.svc.notifier.notify(
                "approval_needed", goal.id,
                f"candidate {w['candidate_id']} needs a budget extension of {w['card_hours']:.2f} card-hours and "
                f"{w['experiments']} experiment(s): {w.get('why')}",
                {"kind": "budget_extension", "candidate_id": w["candidate_id"], "card_hours": w["card_hours"],
                 "experiments": w["experiments"]})
        elif res.status == GoalStatus.WAITING and res.waiting_for:
            w = res.waiting_for
            card = w.get("card") or {}
            what = change_words(card, fmt=str) or "reference run"
            self.svc.notifier.notify(
                "approval_needed", goal.id,
                f"candidate {w['candidate_id']} needs approval: {card.get('stage')} N={card.get('n')} {what} "
                f"[{card.get('cost_class')}], card hash {w['card_hash']} ({w.get('why')})",
                {"candidate_id": w["candidate_id"], "card_hash": w["card_hash"], "card": card})
        elif res.status in (GoalStatus.DONE, GoalStatus.STOPPED, GoalStatus.PAUSED):
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


def _run_session(*args: Any, **kwargs: Any) -> Any:

    return run_session(*args, **kwargs)
