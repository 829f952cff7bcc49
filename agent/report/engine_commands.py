"""The engine's own command for the best station and for every station of the frontier (issue 56 item 4): what a
person pastes to serve a station with vLLM, SGLang, llama.cpp, vLLM-Ascend or MindIE without tuneloop. The command
is the executor's own rendering (executor/engine_command.py); this module picks the stations from a report's
content, and words the report's section. `tuneloop best` and the API's `/goals/{id}/engine-commands` read the same
two functions.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent.report.blocks import Block, Code, Heading, Para
from agent.report.content import Content
from executor.engine_command import EngineCommand, of_run
from state.store import FRONTIER_KINDS


@dataclass(frozen=True)
class StationCommand:
    station: str  # the frozen station's hash
    run_id: str  # the run it comes from
    best: bool  # the goal's deployable best
    command: EngineCommand


def station_commands(c: Content) -> list[StationCommand]:
    """The best station's command first, then each other station of the frontier (a valid best or trade-off, one
    per station whatever its N), in run order."""
    profile = c.goal.spec.sim_profile
    out: list[StationCommand] = []
    best = c.best_station.hash if c.best_station is not None else None
    if c.best_station is not None and c.best is not None:
        out.append(StationCommand(best, c.best.run.id, True, of_run(c.best.run_dir, c.best_station, profile)))
    seen = {best}
    for e in c.experiments:
        if e.station in seen or not any(d.kind in FRONTIER_KINDS for d in e.decisions):
            continue
        seen.add(e.station)
        out.append(StationCommand(e.station or "", e.run.id, False, of_run(e.run_dir, None, profile)))
    return out


def section(c: Content) -> list[Block]:
    """`## The engine's own command`: the best station's, then the frontier's, each as one shell block."""
    out: list[Block] = [Heading(2, "The engine's own command", "engine-command")]
    cmds = station_commands(c)
    if not cmds:
        return out + [Para("No valid station yet: nothing to serve.", "engine-command none")]
    for sc in cmds:
        what = "Best station" if sc.best else "Frontier station"
        cmd = sc.command
        out += [Heading(3, f"{what} {sc.station} (run {sc.run_id})"),
                Para(f"{cmd.engine or 'no engine'}: {cmd.source}.", "muted"),
                Code(cmd.text(), "engine-command best" if sc.best else "engine-command frontier")]
    return out
