"""`tuneloop best GOAL`: the goal's best station, the command that restores it, and the engine's own command that
serves it without tuneloop (with `--frontier`, every other station of the frontier's too)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def best(goal: str = typer.Argument(..., help="goal id in the store, or the goal's spec file (its latest goal)"),
         db: Optional[str] = typer.Option(None, "--db", envvar="TUNELOOP_DB",
                                          help="store URL (default sqlite:///.tuneloop/tuneloop.db)"),
         base: Optional[Path] = typer.Option(None, "--base", help="folder the loop ran in (relative run directories; "
                                                                  "default: the current folder)"),
         frontier: bool = typer.Option(False, "--frontier", help="every station of the frontier too, not the best "
                                                                 "alone"),
         json_out: bool = typer.Option(False, "--json", help="print the stations and their commands as JSON")) -> None:
    """Print GOAL's best station, its `tuneloop restore` command and the engine's own command (vllm serve ...,
    python -m sglang.launch_server ..., llama-server ..., MindIE's config.json): exactly the launch the executor
    renders, shell-quoted."""
    from agent.cli.report import goal_in_store
    from agent.report.content import gather
    from agent.report.engine_commands import station_commands

    with goal_in_store(goal, db) as (store, gid):
        c = gather(store, gid, base)
    cmds = [sc for sc in station_commands(c) if frontier or sc.best]
    if json_out:
        typer.echo(json.dumps({"goal": gid, "restore": c.restore_command, "stations": [
            {**sc.command.model_dump(mode="json"), "station": sc.station, "run_id": sc.run_id, "best": sc.best,
             "text": sc.command.text()} for sc in cmds]}, indent=1))
        return
    if c.best_station is None:
        typer.echo(f"goal {gid}: no deployable best station yet")
    else:
        typer.echo(f"goal {gid}: best station {c.best_station.hash}")
        typer.echo(f"restore with tuneloop: {c.restore_command}")
    for sc in cmds:
        head = "best station" if sc.best else "frontier station"
        typer.echo(f"\n# {head} {sc.station} (run {sc.run_id}), {sc.command.engine or 'no engine'}: "
                   f"{sc.command.source}")
        typer.echo(sc.command.text())
    if c.best_station is None:
        raise typer.Exit(1)
