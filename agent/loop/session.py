"""One invocation of the loop for one goal: open (or continue) the goal, run the graph to a stop or an approval.

Restarting with the same goal spec and store continues the same goal: the store says what finished and
what was approved, so nothing is repeated and no approval is asked twice.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent.loop.graph import build_graph, checkpointer, run_config
from agent.loop.nodes import Loop
from agent.planner import LLMEndpoint, Planner, build_planner
from core.executor_port import ExecutorPort
from executor.phases import crashpoint
from executor.runner import Executor
from state.goal import GoalSpec
from state.lifecycle import GoalStatus, OutcomeKind, WaitingFor
from state.snapshots import Goal
from state.statefile import write_state
from state.store import Store, default_url


@dataclass
class SessionResult:
    goal_id: str
    status: str  # done | stopped | paused | waiting (for an approval)
    reason: str
    waiting_for: dict[str, Any] | None = None  # the interrupt payload (card, candidate_id, card_hash)
    state_path: str | None = None
    notes: list[str] = field(default_factory=list)
    already_finished: bool = False  # the goal had finished before this call: nothing was run


def default_store_url(goal_path: str | Path | None = None) -> str:
    return default_url()


def finished(store: Store, goal: Goal) -> bool:
    """Done, and no instruction given since that asks for more (one more round, resume, go back)."""
    if goal.status != GoalStatus.DONE:
        return False
    ins = store.current_instruction(goal.id)
    if ins is None or ins.kind in ("pause", "stop"):
        return True
    made, done_at = ins.created_at, goal.updated_at
    if made.tzinfo is None or done_at.tzinfo is None:
        made, done_at = made.replace(tzinfo=None), done_at.replace(tzinfo=None)
    return made <= done_at


def finished_reason(goal: Goal, state_path: str) -> str:
    return (f"goal {goal.id} already finished: {goal.status_reason or 'done'}. Results: {state_path}, "
            f"`tuneloop report {goal.id}`; run with --new to start a fresh goal with this spec")


TWIN_ENV = "TUNELOOP_TWIN"  # on | off: whether the planner searches the goal's twin when a session does not say
TWIN_DEFAULT = "on"  # the twin leads by default (issue 43): `tuneloop run --no-twin` or TUNELOOP_TWIN=off turn it off


def twin_enabled(twin: bool | None) -> bool:
    """The session's choice, else TUNELOOP_TWIN (on|off; default on); any other value is an error naming it."""
    if twin is not None:
        return twin
    raw = os.environ.get(TWIN_ENV, TWIN_DEFAULT).strip().lower()
    if raw not in ("on", "off"):
        raise ValueError(f"{TWIN_ENV}={raw!r}: must be on or off")
    return raw == "on"


def make_planner(llm_base_url: str | None, llm_model: str = "tuneloop-planner", api_key: str | None = None) -> Planner:
    """The LLM planner on that endpoint, or the deterministic one without a base URL (agent/planner/compose.py)."""
    return build_planner(llm=LLMEndpoint(llm_base_url, llm_model, api_key))


def waiting_reason(payload: dict[str, Any]) -> str:
    """The goal's status reason while it waits (and the ask's text): what it waits for, then why it asks."""
    return f"{waiting_head(payload)}: {payload.get('why')}"


def waiting_head(payload: dict[str, Any]) -> str:
    """What the loop waits for, from the ask's payload (or its recorded data: the same keys)."""
    if payload.get("kind") == "budget_extension":
        return (f"waiting for a budget extension of {payload.get('card_hours', 0):.2f} card-hours and "
                f"{payload.get('experiments', 0)} experiment(s) for candidate {payload.get('candidate_id')}")
    return f"waiting for approval of candidate {payload.get('candidate_id')}"


def waiting_for(payload: dict[str, Any]) -> WaitingFor:
    """What the loop's ask waits for: a budget extension, or a decision on a card."""
    return WaitingFor.BUDGET_EXTENSION if payload.get("kind") == "budget_extension" else WaitingFor.APPROVAL


def record_ask(store: Store, goal_id: str, payload: dict[str, Any], reason: str) -> None:
    """What the loop asked a person, in the decision log (once per card hash and kind): the card hash in it
    is the one the person is shown, so an approval by chat is bound to it."""
    data = {k: payload.get(k) for k in ("kind", "candidate_id", "card_hash", "card_hours", "experiments")}
    last = store.decisions(goal_id, ("ask",))
    if last and {k: last[-1].data.get(k) for k in data} == data:
        return
    store.record_decision(goal_id, "ask", candidate_id=payload.get("candidate_id"), text=reason, data=data)


def run_session(spec: GoalSpec, store_url: str, *, auto_approve: bool = False, planner: Planner | None = None,
                executor: ExecutorPort | None = None, faults: Callable | None = None, resume: Any = None,
                on_event: Callable[[str, dict[str, Any]], None] | None = None, who: str = "tuneloop run",
                goal_id: str | None = None, targets: dict[str, Any] | None = None,
                new_goal: bool = False, twin: bool | None = None) -> SessionResult:
    """Run the loop for `spec` until it stops or waits for a person; `resume` answers a pending approval.

    The same spec continues its latest goal; a goal that already finished is not run again (the result
    says so and where its results are) unless an instruction given since asks for more; `new_goal`
    starts a fresh goal with the same spec. `twin`: the planner searches the goal's twin (a simulator calibrated
    to the goal's runs, agent/planner/twin.py); None reads TUNELOOP_TWIN (on|off, default on).
    """
    from langgraph.types import Command  # deferred: langgraph, loaded when a session runs


    store = Store(store_url)
    try:
        if goal_id:
            goal = store.get_goal(goal_id)
        else:
            goal = store.create_goal(spec) if new_goal else store.open_goal(spec)
        executor = executor or Executor(store, targets)  # targets: e.g. a local llama.cpp server (issue 7)
        runs_root = executor.runs_root
        if resume is None and finished(store, goal):
            ins = store.current_instruction(goal.id)
            if ins is not None and ins.kind in ("pause", "stop"):  # nothing left for it to hold: say so
                store.settle_instruction(ins.id, OutcomeKind.DONE, f"the goal had already ended ({goal.status})")
            path = str(write_state(store, goal.id, runs_root=runs_root))
            return SessionResult(goal.id, goal.status, finished_reason(goal, path), state_path=path,
                                 already_finished=True)
        executor.bind_sim_profile(goal.spec.target, goal.spec.sim_profile)
        state_path: list[str] = []

        def state_file(st: Store, gid: str, **info: Any) -> None:
            state_path[:] = [str(write_state(st, gid, runs_root=runs_root))]

        # a calibrated profile: screens are simulated before they run
        planner = build_planner(planner, simulator=executor, target=goal.spec.target)
        fitter = executor.twin_fitter(goal.spec.target, goal.spec.sim_profile) if twin_enabled(twin) else None
        loop = Loop(store=store, executor=executor, goal_id=goal.id, planner=planner,
                    auto_approve=auto_approve, who=who, faults=faults,
                    on_event=on_event or (lambda phase, info: None), state_file=state_file, twin=fitter)
        with checkpointer(store.url if hasattr(store, "url") else store_url) as saver:
            graph = build_graph(loop, saver)
            cfg = run_config(goal.id)
            pending = graph.get_state(cfg).interrupts if resume is not None else ()
            inp: Any = Command(resume=resume) if pending else {"goal_id": goal.id}
            out = graph.invoke(inp, cfg, durability="sync")
            interrupts = out.get("__interrupt__") if isinstance(out, dict) else None
        if interrupts:
            payload = interrupts[0].value
            reason = waiting_reason(payload)
            if store.get_goal(goal.id).status == GoalStatus.RUNNING:
                store.set_goal_status(goal.id, "waiting", reason, waiting_for(payload))
            record_ask(store, goal.id, payload, reason)
            crashpoint("approval", "waiting")  # tests: SIGKILL while the loop waits for a person (checkpoint written)
            state_file(store, goal.id)
            return SessionResult(goal.id, "waiting", reason, waiting_for=payload,
                                 state_path=state_path[0] if state_path else None, notes=loop.notes)
        g = store.get_goal(goal.id)
        return SessionResult(goal.id, g.status, out.get("stop_said") or out.get("stop_reason") or g.status_reason or "",
                             state_path=state_path[0] if state_path else None, notes=loop.notes)
    finally:
        store.close()
