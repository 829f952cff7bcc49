"""Goals: create, list, get, pause / resume / stop, instructions, decisions."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from fastapi import APIRouter, HTTPException, Request, status

from agent.loop.progress import goal_progress
from agent.report.people import split_who
from api import actions, idempotency, permissions
from api.auth import Admin, Approver, Viewer
from api.deps import ServiceDep, StoreDep, ViaDep
from api.failures import shown_status
from api.routes.budget import budget_out
from api.schemas import DecisionOut, GoalOut, InstructionIn, InstructionOut
from core.bounded import BoundsError, excerpt, load_json, load_yaml
from core.errors import FieldError
from core.ledger import by_source, median_abs_error
from state.errors import GoalError
from state.hypotheses import hypothesis_ledger
from state.goal import parse_goal
from state.workqueue import WorkState

if TYPE_CHECKING:  # annotations only
    from api.service import Service
    from state.snapshots import Goal

router = APIRouter(prefix="/goals", tags=["goals"])
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
GOAL_BODY = {"$ref": "#/components/schemas/GoalSpec"}  # api.app puts state.goal.GoalSpec's schema there


def goal_out(g: Goal, svc: Service) -> GoalOut:
    store = svc.store
    w = store.work_item(g.id)
    return GoalOut(id=g.id, name=g.name, status=shown_status(g, w is not None and w.state == WorkState.FAILED),
                   status_reason=g.status_reason, target=g.spec.target, worker_state=w.state if w else None,
                   scenario=g.spec.scenario, spec_hash=g.spec_hash, spec=g.spec.model_dump(mode="json"),
                   created_at=g.created_at, updated_at=g.updated_at, budget=budget_out(store.budget(g.id)),
                   progress=goal_progress(store, g.id, svc.base / svc.settings.runs_root))


async def goal_body(request: Request) -> Any:
    """The posted goal as data: JSON (`application/json`) or YAML (`application/yaml`), as in examples/."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    try:
        if kind in YAML_TYPES:
            return load_yaml(raw.decode("utf-8"))
        if kind == "application/json" or kind.endswith("+json"):
            return load_json(raw)  # bounded and its keys checked by the request guard (api/guard.py) already
    except BoundsError as e:
        raise GoalError("request body", [("(body)", str(e))]) from None
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        what = "YAML" if kind in YAML_TYPES else "JSON"
        raise GoalError("request body", [("(body)", f"not valid {what}: {excerpt(str(e), 300)}")]) from None
    raise HTTPException(415, f"content-type {kind!r}: post a goal as application/json or application/yaml")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=GoalOut,
             responses={422: {"description": "the goal spec was refused; each error names its field"},
                        415: {"description": "neither JSON nor YAML"}},
             openapi_extra={"requestBody": {"required": True, "description": "a goal spec, the same fields as a goal "
                                            "YAML (examples/goal-*.yaml)", "content": {
                                                "application/json": {"schema": GOAL_BODY},
                                                "application/yaml": {"schema": GOAL_BODY}}}})
async def create_goal(request: Request, svc: ServiceDep, who: Admin,
                      idempotency_key: idempotency.KeyHeader = None) -> GoalOut:
    """Post a goal (JSON or YAML); a worker picks it up and runs the loop. With an `Idempotency-Key` a repeated
    POST (a retry, a double click) answers with the goal the first one created; an identical spec already
    running on the same target gets 409."""
    parsed = parse_goal(await goal_body(request), "request body")
    if parsed.target not in svc.targets:
        raise FieldError("target", f"{parsed.target!r} is not a target of this service (known: {sorted(svc.targets)})")
    goal = idempotency.create_goal(svc.store, parsed, who.name, idempotency_key)
    svc.store.wake(goal.id, who.name, target=parsed.target)
    return goal_out(goal, svc)


@router.get("", response_model=list[GoalOut])
def list_goals(svc: ServiceDep, _: Viewer) -> list[GoalOut]:
    return [goal_out(g, svc) for g in svc.store.goals()]


@router.get("/{goal_id}", response_model=GoalOut)
def get_goal(goal_id: str, svc: ServiceDep, _: Viewer) -> GoalOut:
    """The goal, its budget used so far and (while an experiment runs) its progress."""
    return goal_out(svc.store.get_goal(goal_id), svc)


def instruction_out(ins_note: tuple[Any, str]) -> InstructionOut:
    ins, note = ins_note
    return InstructionOut.model_validate(ins, from_attributes=True).model_copy(update={"note": note or None})


def _instr(svc: Any, goal_id: str, kind: str, who: Any, via: str) -> InstructionOut:
    return instruction_out(actions.instruct(svc, goal_id, kind, who, via=via))


@router.post("/{goal_id}/pause", response_model=InstructionOut)
def pause(goal_id: str, svc: ServiceDep, who: Approver, via: ViaDep) -> InstructionOut:
    """Pause between phases: the running experiment finishes its phase, nothing new starts (a card that waits for
    a person is decided first). A pause while one is in force is refused (409), recorded with why."""
    return _instr(svc, goal_id, "pause", who, via)


@router.post("/{goal_id}/resume", response_model=InstructionOut)
def resume(goal_id: str, svc: ServiceDep, who: Approver, via: ViaDep) -> InstructionOut:
    return _instr(svc, goal_id, "resume", who, via)


@router.post("/{goal_id}/stop", response_model=InstructionOut)
def stop(goal_id: str, svc: ServiceDep, who: Approver, via: ViaDep) -> InstructionOut:
    return _instr(svc, goal_id, "stop", who, via)


@router.post("/{goal_id}/instructions", response_model=InstructionOut, status_code=status.HTTP_201_CREATED)
def add_instruction(goal_id: str, body: InstructionIn, svc: ServiceDep, who: Approver, via: ViaDep) -> InstructionOut:
    """Any instruction, e.g. `{"kind": "one_more_round", "count": 1, "knobs": {"concurrency": 90}}`;
    `{"kind": "restore"}` goes back to the best station (or to `restore`, a station hash)."""
    svc.store.get_goal(goal_id)
    permissions.check(who, permissions.INSTRUCTIONS[body.kind])  # a restore is admin's, on every path
    if body.kind == "restore" and body.restore is not None:
        actions.check_restore(svc, goal_id, body.restore)
    return instruction_out(actions.instruct(svc, goal_id, body.kind, who, count=body.count, knobs=body.knobs,
                                            restore=body.restore, text=body.text, via=via))


@router.get("/{goal_id}/instructions", response_model=list[InstructionOut])
def list_instructions(goal_id: str, store: StoreDep, _: Viewer) -> list[InstructionOut]:
    store.get_goal(goal_id)
    return [InstructionOut.model_validate(i, from_attributes=True) for i in store.instructions(goal_id)]


@router.get("/{goal_id}/decisions", response_model=list[DecisionOut])
def list_decisions(goal_id: str, store: StoreDep, _: Viewer) -> list[DecisionOut]:
    """The decision log, oldest first, each with the person behind it and where they said it (`who`, `via`)."""
    store.get_goal(goal_id)
    approvals: dict[int, Any] = {}
    out = []
    for d in store.decisions(goal_id):
        said = d.data.get("asked_by") or d.data.get("who") if isinstance(d.data, dict) else None
        if not said and d.candidate_id is not None and d.kind != "ask":
            if d.candidate_id not in approvals:
                approvals[d.candidate_id] = store.approval(d.candidate_id)
            ap = approvals[d.candidate_id]
            said = ap.who if ap is not None and not ap.automatic else None
        name, via = split_who(said) if isinstance(said, str) else (None, "")
        out.append(DecisionOut.model_validate(d, from_attributes=True).model_copy(
            update={"who": name, "via": via or None}))
    return out


@router.get("/{goal_id}/hypotheses")
def hypotheses(goal_id: str, store: StoreDep, _: Viewer) -> dict[str, Any]:
    """The hypothesis ledger: each judged card's prediction (source, objective and binding-SLO effect with an
    interval) beside the effect its run observed, the errors, and the median absolute prediction error (overall
    and per source). Effects are relative (0.05 = +5 %), errors absolute differences of them."""
    store.get_goal(goal_id)
    rows = hypothesis_ledger(store, goal_id)
    return {"goal_id": goal_id, "median_abs_prediction_error": median_abs_error(rows),
            "by_source": by_source(rows), "cards": [r.model_dump(mode="json") for r in rows]}
