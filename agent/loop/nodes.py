"""The loop's nodes: observe → diagnose → propose → authorise → execute → judge → decide → observe … → stop.

Each node reads what it needs from the store (the record of truth), does one thing, writes its outcome
back, and names where the graph goes next. Graph state holds only ids and small JSON (msgpack-safe).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from langgraph.types import Command

from agent.loop import approval
from agent.planner import (CandidateCard, DeterministicPlanner, Figures, Fitter, History, Planner, carry_diagnosis,
                           closes_hypothesis, diagnosis_for, estimate, judge_run, observed, predict, wants_profile,
                           with_attempt)
from agent.loop.record import (CHANGED, KIND, OPEN_STATUSES, build_history, card_of, card_record, conditions,
                               outcome_data, record_set_asides)
from agent.loop.instructed import awaiting_person, counts_as_round, instructed_card, started
from agent.loop.restore import go_back
from agent.loop.state import LoopState
from core.executor_port import ExecutorPort
from core.station import Station
from core.trial import TrialSpec
from state.authorisation import instruction_effect
from state.lifecycle import SET_ASIDE, STARTED, CandidateStatus, GoalStatus, OutcomeKind, RunStatus
from state.ledger import tooling_note

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

FAULT_RETRIES = 2  # re-entries of run_trial for one run after a fault (it resumes at the failed phase)


def _unknown(result: Any) -> bool:
    return any(r.code == "unknown_state" for r in result.verdict.reasons)


@dataclass
class Loop:
    """Everything the nodes share: the store, the executor, the planner and the run's options."""

    store: Store
    executor: ExecutorPort
    goal_id: str
    planner: Planner = field(default_factory=DeterministicPlanner)
    auto_approve: bool = False
    who: str = "tuneloop run"
    faults: Callable[[CandidateCard, int], list[str]] | None = None  # fault injection (tests)
    on_event: Callable[[str, dict[str, Any]], None] = lambda phase, info: None
    state_file: Any = None  # callable(store, goal_id, **info) that rewrites STATE.md
    notes: list[str] = field(default_factory=list)
    twin: Fitter | None = None  # the goal's twin fitter (agent/planner/twin_fit.py), if any

    # -- helpers -------------------------------------------------------------------------------------
    _history: History | None = field(default=None, repr=False)

    def history(self) -> History:
        """The iteration's history: built once, at the first node that needs it after `observe`. Within an
        iteration nothing it holds changes before `judge` reads it (a run's outcome becomes history only through
        the decision judge records, and the next iteration starts from `observe` again)."""
        if self._history is None:
            self._history = build_history(self.store, self.goal_id, self.notes).with_twin(self.twin)
        return self._history

    def event(self, phase: str, **info: Any) -> None:
        self.on_event(phase, info)
        if self.state_file is not None:
            try:
                self.state_file(self.store, self.goal_id, phase=phase, **info)
            except Exception as e:  # the state file must never stop the loop
                self.notes.append(f"state file not written: {e}")

    def _gate(self) -> tuple[str, str, str | None] | None:
        """(status, reason, who asked: "name (via)" or None) when an instruction or an UNKNOWN run forbids new work;
        else None."""
        unknown = self.store.runs(self.goal_id, status="unknown")
        if unknown:
            return "stopped", f"run {unknown[0].id} is in an UNKNOWN state: no new work until a person resolves it", None
        ins = self.store.current_instruction(self.goal_id)
        effect = instruction_effect(ins)
        if effect in ("restore", "pause", "stop") and awaiting_person(self.store, self.goal_id):
            return None  # given while a card waits for a person: it takes effect after that decision, not instead
        if effect == "restore":
            return "restore", f"go back to the best, asked by {ins.who}", ins.who
        if effect == "pause":
            self.store.settle_instruction(ins.id, OutcomeKind.DONE, "the goal paused")
            return "paused", f"paused by {ins.who}", ins.who
        if effect == "stop":
            if ins.kind == "one_more_round":
                self.store.settle_instruction(ins.id, OutcomeKind.DONE, f"{ins.count} more round(s) ran")
                return "stopped", f"instruction fulfilled: {ins.count} more round(s) ran", ins.who
            self.store.settle_instruction(ins.id, OutcomeKind.DONE, "the goal stopped")
            return "stopped", f"stopped by {ins.who}", ins.who
        if ins is not None and ins.kind == "resume":
            self.store.settle_instruction(ins.id, OutcomeKind.DONE, "the loop resumed")
        return None

    # -- nodes ---------------------------------------------------------------------------------------
    def observe(self, state: LoopState) -> Command[Literal["diagnose", "restore", "stop"]]:
        self._history = None  # a new iteration: decisions, budget and vetoes may have moved since
        gate = self._gate()
        if gate and gate[0] == "restore":
            return Command(goto="restore")
        if gate:
            return Command(goto="stop", update={"stop_status": gate[0], "stop_reason": gate[1], "stop_by": gate[2]})
        goal = self.store.get_goal(self.goal_id)
        if goal.status != GoalStatus.RUNNING and not awaiting_person(self.store, self.goal_id):
            # woken while a person owes a decision (an instruction queued behind it): the goal stays "waiting",
            # so that person's approval is never refused as "not waiting" while the loop asks again
            self.store.set_goal_status(self.goal_id, "running", "loop running")
        self.event("observe")
        return Command(goto="diagnose")

    def diagnose(self, state: LoopState) -> Command[Literal["propose"]]:
        diag = diagnosis_for(self.history())
        text = diag.text() if diag else None
        self.event("diagnose", diagnosis=text)
        return Command(goto="propose", update={"diagnosis": text,
                                               "diagnosis_data": diag.model_dump(mode="json") if diag else None})

    def propose(self, state: LoopState) -> Command[Literal["authorise", "stop"]]:
        history = self.history()
        carry_diagnosis(history, dict(state))
        ins = self.store.current_instruction(self.goal_id)
        instructed = ins is not None and ins.kind == "one_more_round" and bool(ins.knobs)
        # a card already proposed (perhaps waiting for a person, perhaps approved) is carried out first: an
        # instruction runs after it, never instead of it
        open_ = [c for c in self.store.candidates(self.goal_id) if c.status in OPEN_STATUSES]
        if open_:  # an experiment was started before a restart: finish it, never plan a second one
            cand = open_[0]
            self.event("propose", card=cand.card, resumed=True)
            return Command(goto="authorise", update={"candidate_id": cand.id})
        card, plan = None, None
        if instructed:
            card, refusal = instructed_card(self.store, self.goal_id, history)
            if card is None and refusal:
                self.store.close_instruction(ins.id, OutcomeKind.REFUSED, refusal)
                return Command(goto="stop", update={"stop_status": "stopped", "stop_reason": refusal})
        if card is None:
            plan = self.planner.ask(history)
            record_set_asides(self.store, self.goal_id, plan)  # the pre-screen's set-asides: notes, never negatives
            self.notes.extend(plan.notes)
            if plan.fallback:
                self.store.record_decision(self.goal_id, "note", text=f"LLM planner fell back: {plan.fallback}",
                                           data={"fallback": plan.fallback})
            card = plan.card
        if card is None:
            reason = (plan.stop_reason if plan else None) or "the planner has nothing to propose"
            return Command(goto="stop", update={"stop_status": "done", "stop_reason": reason})
        card = predict(with_attempt(card, history), history)  # every card carries a numeric prediction
        if plan is not None and wants_profile(plan.diagnosis, card, history):
            card = card.model_copy(update={"profile_capture": True})
        rec = card_record(card)
        if card.profile_capture and plan is not None and plan.diagnosis is not None:
            rec["profile_reason"] = plan.diagnosis.profile_reason
        if plan is not None and plan.diagnosis is not None:
            rec["diagnosis"] = plan.diagnosis.model_dump(mode="json")
            rec["ranked"] = [r.record() for r in plan.ranked[:8]]
        cand = self.store.add_candidate(self.goal_id, rec)
        vetoed = any(v.candidate_id == cand.id for v in self.store.vetoes(self.goal_id))
        # rejected while no loop ran: authorise records the veto
        if cand.status == CandidateStatus.REJECTED and not vetoed:
            return Command(goto="authorise", update={"candidate_id": cand.id})
        # set aside unrun (superseded, asked again): a fresh card
        if cand.status == CandidateStatus.CANCELLED and not vetoed:
            cand = self.store.add_candidate(self.goal_id, {**rec, "note": f"proposed again after candidate {cand.id} "
                                                                           f"was cancelled ({cand.status_reason})"})
        if cand.status not in OPEN_STATUSES:  # the very card decided before: never run it again, never spin
            reason = (f"nothing left that was not rejected: the planner proposed candidate {cand.id} "
                      f"({card.title()}) again, which is {cand.status}")
            return Command(goto="stop", update={"stop_status": "done", "stop_reason": reason})
        self.event("propose", card=rec)
        return Command(goto="authorise", update={"candidate_id": cand.id})

    def _started(self, cand: Any) -> bool:
        return started(self.store, self.goal_id, cand)

    def authorise(self, state: LoopState) -> Command[Literal["execute", "observe", "authorise", "stop"]]:
        cand = self.store.get_candidate(state["candidate_id"])
        if cand.status in STARTED:
            return Command(goto="execute")  # authorised before a restart
        card = card_of(cand.card)
        history = self.history()
        ins = self.store.current_instruction(self.goal_id)
        instructed = ins.who if ins is not None and ins.kind == "one_more_round" and ins.knobs \
            and cand.card.get("planner") == "instruction" else None
        decision, why = approval.authorise(self.store, self.goal_id, cand.id, cand.card, cand.card_hash,
                                           auto_approve=self.auto_approve, who=self.who,
                                           estimate=estimate(card, history), instructed_by=instructed)
        if decision == "approve":
            self.event("authorise", card=cand.card, why=why)
            return Command(goto="execute")
        if decision in ("stop", "spent"):  # the budget cannot pay for it and no extension can be had
            if cand.status not in SET_ASIDE:
                self.store.set_candidate_status(cand.id, "cancelled", why)
            self.store.record_decision(self.goal_id, "note", candidate_id=cand.id, text=f"{card.title()} not run: {why}")
            return Command(goto="stop", update={"stop_status": "done" if decision == "spent" else "stopped",
                                                "stop_reason": why, "candidate_id": None})
        if decision == "reask":  # the approval no longer covers it: the same experiment, asked again as a new card
            self.store.set_candidate_status(cand.id, "cancelled", why)
            self.store.record_decision(self.goal_id, "note", candidate_id=cand.id, text=f"{card.title()}: {why}")
            again = self.store.add_candidate(self.goal_id, {**cand.card, "note": f"asked again: {why}"})
            return Command(goto="authorise", update={"candidate_id": again.id})
        # a person's rejection, or the authorisation table's deny: a veto under these conditions, never proposed again
        source = "person" if decision == "reject" else "authorisation"
        prior = self.store.approval(cand.id)
        by = prior.who if prior is not None and decision == "reject" else "authorisation table"
        reason = (prior.reason or "") if prior is not None and decision == "reject" else why
        if decision == "deny" and cand.status not in SET_ASIDE:
            self.store.set_candidate_status(cand.id, "cancelled", why)
        if not any(v.candidate_id == cand.id for v in self.store.vetoes(self.goal_id)):
            self.store.add_veto(self.goal_id, card.change.knob if card.change else None,
                                card.change.new if card.change else None, conditions(card, history), who=by,
                                reason=reason, source=source, candidate_id=cand.id)
            what = "rejected by " + by if source == "person" else "denied by the authorisation table"
            self.store.record_decision(self.goal_id, "rejected", candidate_id=cand.id,
                                       text=f"{card.title()} {what}" + (f": {reason}" if reason else "")
                                       + " (a veto, not a measurement: not proposed again under the same conditions)",
                                       data={"source": source, "who": by, "reason": reason,
                                             "knob": card.change.knob if card.change else None,
                                             "value": card.change.new if card.change else None,
                                             "parent_knobs_hash": card.parent_knobs_hash,
                                             "data_version": history.data_version})
        self.event("authorise", card=cand.card, why=why, rejected=True)
        return Command(goto="observe", update={"candidate_id": None})

    def execute(self, state: LoopState) -> Command[Literal["judge", "restore", "stop"]]:
        gate = self._gate()
        if gate and gate[0] == "restore":
            return Command(goto="restore")
        if gate:  # pause is honoured between phases: the card stays approved, nothing launched
            return Command(goto="stop", update={"stop_status": gate[0], "stop_reason": gate[1], "stop_by": gate[2]})
        cand = self.store.get_candidate(state["candidate_id"])
        card = card_of(cand.card)
        history = self.history()
        goal = history.goal
        n_runs = len(self.store.runs(self.goal_id))
        known = {r.id: r for r in self.store.runs(self.goal_id)}.get(card.run_id())
        spec = TrialSpec.model_validate(known.spec) if known is not None else TrialSpec(run_id=card.run_id(), goal_id=self.goal_id, target=goal.target, scenario=goal.scenario,
                         knobs=card.knobs, parent_knobs=history.warm_knobs, stage=card.stage, n=card.n,
                         warmup=goal.protocol.warmup, seed=goal.protocol.seeds[0],
                         faults=list(self.faults(card, n_runs)) if self.faults else [],
                         profile_capture=card.profile_capture, contract=goal.contract(), slos=goal.slos() or None)
        self.store.create_run(spec, candidate_id=cand.id)
        if cand.status != CandidateStatus.RUNNING:
            self.store.set_candidate_status(cand.id, "running")
        self.event("execute", card=cand.card, run_id=spec.run_id)
        run = self.store.get_run(spec.run_id)
        if run.status in (RunStatus.PENDING, RunStatus.FAILED, RunStatus.UNKNOWN):
            self.store.set_run_status(spec.run_id, "running")
        try:
            result = self.executor.run_trial(spec)
            tries = 0
            while result.verdict.kind in ("collection_fault", "orchestration_fault") and tries < FAULT_RETRIES \
                    and not _unknown(result):
                tries += 1  # the executor resumes at the failed phase: re-collect, never re-run a finished load
                self.event("execute", card=cand.card, run_id=spec.run_id, retry=tries, fault=result.verdict.kind)
                result = self.executor.run_trial(spec)
        except Exception as e:  # TargetUnknown, a lost lease, a broken target: the run's state is not known
            self.store.set_run_status(spec.run_id, "unknown", f"{type(e).__name__}: {e}")
            self.store.set_candidate_status(cand.id, "unknown", "run state UNKNOWN")
            return Command(goto="stop", update={"stop_status": "stopped",
                                                "stop_reason": f"run {spec.run_id} is in an UNKNOWN state: {e}"})
        if _unknown(result):
            self.store.set_run_status(spec.run_id, "unknown", result.error)
            self.store.set_candidate_status(cand.id, "unknown", "run state UNKNOWN")
            return Command(goto="stop", update={"stop_status": "stopped",
                                                "stop_reason": f"run {spec.run_id} is in an UNKNOWN state: {result.error}"})
        self._put_station(spec.run_id)
        self.store.record_result(result, goal_id=self.goal_id)
        self.store.set_run_status(spec.run_id, "done" if result.verdict.kind != "orchestration_fault" else "failed",
                                  result.verdict.kind, station_hash=result.station_hash)
        return Command(goto="judge", update={"run_id": spec.run_id})

    def _put_station(self, run_id: str) -> None:
        """The frozen station of a run goes into the store, so "go back to the best" has its bytes."""

        try:
            frozen = self.executor.station_of(run_id)
        except (OSError, ValueError, AttributeError):
            return
        fields = {k: frozen[k] for k in Station.model_fields if k in frozen}
        try:
            self.store.put_station(Station.model_validate(fields))
        except Exception as e:  # a station that cannot be stored must not lose the result
            self.notes.append(f"station of {run_id} not stored: {e}")

    def judge(self, state: LoopState) -> Command[Literal["decide"]]:
        cand = self.store.get_candidate(state["candidate_id"])
        card = card_of(cand.card)
        res = self.store.get_result(state["run_id"]).result
        history = self.history()
        goal = history.goal
        figures = None
        if res.verdict.kind == "valid" and res.summary is not None:
            figures = Figures.of(res.summary, goal.objective.metric, goal.constraints.violations(res.summary))
        done = [d for d in self.store.decisions(self.goal_id) if d.run_id == res.run_id and "outcome" in (d.data or {})]
        if done:  # judged before a restart: never judge (or count) a run twice
            if cand.status not in (CandidateStatus.DONE, CandidateStatus.CANCELLED):
                self.store.set_candidate_status(cand.id, "done", done[0].text)
            return Command(goto="decide")
        outcome, reason = judge_run(card, res.verdict.kind, figures, history)
        reasons = "; ".join(r.message for r in res.verdict.reasons)
        closed = closes_hypothesis(outcome, card, history)  # a negative that closes a hypothesis changes a decision
        text = f"{card.title()}: {reason}" + (f"; closes {closed}" if closed else "") + (f" [{reasons}]" if reasons else "")
        seen = observed(card, figures, res.summary, history)  # the ledger's observed effect
        self.store.record_decision(self.goal_id, KIND[outcome], candidate_id=cand.id, run_id=res.run_id,
                                   station_hash=res.station_hash, changed=outcome in CHANGED or closed is not None,
                                   text=text, data=outcome_data(outcome, res.verdict.kind, figures, card.knobs) | seen)
        known = card.change is not None and any(
            n.applies(card.change.knob, card.change.new, card.scenario, history.data_version, card.parent_knobs_hash,
                      history.source_identity) for n in history.negatives)
        if outcome == "negative" and card.change is not None and not card.multi and not known:
            # (an instruction may repeat one; a coupled pair's negative is its own experiment, not either change's)
            self.store.add_negative(card.change.knob, card.change.new, conditions(card, history), goal_id=self.goal_id,
                                    run_id=res.run_id, candidate_id=cand.id, reason=reason)
        if outcome == "quality_pending":
            self._quality_gate(cand.id, card, res)
        final = CandidateStatus.DONE if outcome != "fault" else CandidateStatus.FAILED
        self.store.set_candidate_status(cand.id, final, reason)
        if final == CandidateStatus.FAILED:  # a fault is not a result; the card is closed without becoming a negative
            self.store.set_candidate_status(cand.id, CandidateStatus.CANCELLED, "fault: retries exhausted")
        self.event("judge", card=cand.card, outcome=outcome, reason=text)
        return Command(goto="decide")

    def _quality_gate(self, candidate_id: int, card: CandidateCard, res: Any) -> None:
        """A quality-risk change becomes the deployable best only after its evaluation passes."""
        goal = self.store.get_goal(self.goal_id).spec
        q = self.executor.evaluate_quality(goal.target, card.knobs, seed=goal.protocol.seeds[0])
        if q is None:
            return  # no evaluation available on this target: it stays "performance-positive, quality pending"
        kind = "quality_passed" if q.passed else "quality_failed"
        text = f"quality evaluation of {card.title()}: score {q.score:.4g} vs baseline {q.baseline:.4g} -> " + (
            "passed: deployable" if q.passed else "failed: never deployable")
        self.store.record_decision(self.goal_id, kind, candidate_id=candidate_id, run_id=res.run_id,
                                   station_hash=res.station_hash, changed=q.passed, text=text,
                                   data={"knobs": card.knobs} if q.passed else {"detail": str(q.detail)})

    def restore(self, state: LoopState) -> Command[Literal["observe", "stop"]]:
        """"Go back to the best": re-deploy the best (or the named) station, record who asked, then stop; an
        instruction still in force (a pause or a stop given before it, a pause or a round given after) is carried
        out next."""
        if self.store.get_goal(self.goal_id).status != GoalStatus.RUNNING:
            self.store.set_goal_status(self.goal_id, "running", "going back to the best station")
        reason = go_back(self.store, self.executor, self.goal_id, self.event)
        if self.store.current_instruction(self.goal_id) is not None:
            return Command(goto="observe")
        return Command(goto="stop", update={"stop_status": "stopped", "stop_reason": reason})

    def decide(self, state: LoopState) -> Command[Literal["observe"]]:
        ins = self.store.current_instruction(self.goal_id)
        if ins is not None and ins.kind == "one_more_round":
            cand = self.store.get_candidate(state["candidate_id"]) if state.get("candidate_id") else None
            if counts_as_round(ins, cand):
                self.store.consume_round(self.goal_id)
        self.event("decide")
        return Command(goto="observe", update={"candidate_id": None, "run_id": None})

    def stop(self, state: LoopState) -> dict[str, Any]:
        status = state.get("stop_status") or "done"
        # what the tooling's faults cost, added to the reason the stop was sent with (the state's reason is never the
        # recorded words, so a stop run again never says it twice)
        reason = (state.get("stop_reason") or "stopped") + tooling_note(self.store.budget(self.goal_id))
        ins = self.store.current_instruction(self.goal_id)
        if ins is not None and ins.kind == "one_more_round" and (ins.remaining or 0) > 0:
            # the loop ended before the rounds asked for ran (the budget, the planner, a fault): say so
            self.store.settle_instruction(ins.id, OutcomeKind.NOT_DONE, f"{ins.count - ins.remaining} of {ins.count} "
                                                                        f"round(s) ran before the loop stopped ({reason})")
        goal = self.store.get_goal(self.goal_id)
        if goal.status != status:
            try:
                self.store.set_goal_status(self.goal_id, status, reason)
            except Exception:
                self.store.set_goal_status(self.goal_id, "stopped", reason)
        # the person whose instruction stopped it ("name (via)"), on the decision itself; a session woken again while
        # the same instruction still holds the goal where it is (a pause sent while it ran wakes it once more) makes
        # no second decision of it
        data = {"status": status} | ({"asked_by": state["stop_by"]} if state.get("stop_by") else {})
        last = self.store.decisions(self.goal_id, ("stop",))
        if goal.status != status or not last or (last[-1].text, last[-1].data) != (reason, data):
            self.store.record_decision(self.goal_id, "stop", text=reason, data=data)
        self.event("stop", reason=reason, status=status)
        return {"stop_said": reason, "stop_status": status, "stop_by": None}

