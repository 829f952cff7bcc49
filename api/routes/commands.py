"""The engine's own command for a goal's best station and every station of its frontier (issue 56 item 4): what
the dashboard shows beside the best station, the same the report and `tuneloop best` print
(agent/report/engine_commands.py over the executor's own rendering)."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from agent.report.content import gather
from agent.report.engine_commands import station_commands
from api.auth import Viewer
from api.deps import ServiceDep
from executor.engine_command import ServiceCommand

router = APIRouter(tags=["stations"])


class EngineCommandOut(BaseModel):
    station: str
    run_id: str
    best: bool  # the goal's deployable best (listed first); else another station of the frontier
    engine: str | None
    source: str  # where the command comes from: the run's recorded launch, or the simulated profile's deployment
    text: str  # every service's lines, copy-pasteable (a comment heads each)
    services: list[ServiceCommand]
    steps: list[tuple[str, str]]  # expert-relayout steps that run first (name, shell line)
    warnings: list[str]
    error: str | None  # why there is no command (the adapter's refusal naming its field, no deployment)


@router.get("/goals/{goal_id}/engine-commands", response_model=list[EngineCommandOut])
def engine_commands(goal_id: str, svc: ServiceDep, _: Viewer) -> list[EngineCommandOut]:
    """The best station's engine command first, then each other station of the frontier's: `vllm serve ...`,
    `python -m sglang.launch_server ...`, `llama-server ...`, MindIE's config.json: the launch the executor renders,
    shell-quoted (a simulated goal's on its profile's deployment, on placeholder hosts)."""
    svc.store.get_goal(goal_id)
    return [EngineCommandOut(station=sc.station, run_id=sc.run_id, best=sc.best, engine=sc.command.engine,
                             source=sc.command.source, text=sc.command.text(), services=list(sc.command.services),
                             steps=list(sc.command.steps), warnings=list(sc.command.warnings),
                             error=sc.command.error)
            for sc in station_commands(gather(svc.store, goal_id, svc.base))]
