"""`tuneloop exec ...` and `tuneloop restore`: the executor from the command line, over a store (the agent
layer composes the two; the executor itself never imports the state layer).

    tuneloop exec run SPEC.json      run (or finish) one trial; prints the TrialResult JSON
    tuneloop exec resume             finish every unfinished run after a crash
    tuneloop exec phases RUN_ID      the run's phase journal
    tuneloop exec unknown            targets marked UNKNOWN (no work issued to them)
    tuneloop restore STATION         re-deploy a frozen station (hash or run id) and check its health
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Deterministic executor: durable phases, fenced leases, resume after a crash.",
                  no_args_is_help=True)

StoreOpt = typer.Option(None, "--db", "--store", help="state store URL (default $TUNELOOP_DB or sqlite:///.tuneloop/tuneloop.db)")
TargetsOpt = typer.Option(None, "--targets", help="targets YAML (the built-in `sim` target needs none)")
RootOpt = typer.Option(None, "--runs-root", help="executor run directories (default $TUNELOOP_RUNS_ROOT or .tuneloop/runs)")
HolderOpt = typer.Option(None, "--holder", help="lease holder name (default $TUNELOOP_HOLDER or host:executor)")


def _executor(store: Optional[str], targets: Optional[Path], runs_root: Optional[Path], holder: Optional[str]):
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import load_targets
    from state.store import Store, default_url

    url = store or default_url()
    settings = ExecSettings.from_env(runs_root=runs_root, holder=holder)
    try:
        tg = load_targets(targets)
    except (ValueError, OSError) as e:
        raise typer.BadParameter(str(e), param_hint="--targets") from None
    return Executor(Store(url), tg, settings)


@app.command("run")
def run_cmd(spec: Path = typer.Argument(..., help="TrialSpec JSON file"), store: Optional[str] = StoreOpt,
            targets: Optional[Path] = TargetsOpt, runs_root: Optional[Path] = RootOpt,
            holder: Optional[str] = HolderOpt) -> None:
    """Run one trial through every phase; idempotent on the spec's run_id."""
    from pydantic import ValidationError

    from core.trial import TrialSpec

    try:
        ts = TrialSpec.model_validate_json(spec.read_text())
    except (OSError, ValidationError) as e:
        raise typer.BadParameter(f"{spec}: {e}", param_hint="SPEC") from None
    result = _executor(store, targets, runs_root, holder).run_trial(ts)
    typer.echo(result.model_dump_json(indent=1))
    raise typer.Exit(0 if result.verdict.kind == "valid" else 3)


@app.command("resume")
def resume_cmd(store: Optional[str] = StoreOpt, targets: Optional[Path] = TargetsOpt,
               runs_root: Optional[Path] = RootOpt, holder: Optional[str] = HolderOpt) -> None:
    """Finish unfinished runs: load done -> collect; never started -> start; ambiguous -> UNKNOWN."""
    ex = _executor(store, targets, runs_root, holder)
    for r in ex.resume_all():
        typer.echo(json.dumps({"run_id": r.run_id, "verdict": r.verdict.kind, "error": r.error}))
    for tgt, why in ex.unknown_targets().items():
        typer.echo(f"UNKNOWN target {tgt}: {why.strip()} (no work is issued to it)", err=True)


@app.command("phases")
def phases_cmd(run_id: str, store: Optional[str] = StoreOpt) -> None:
    """Print the run's phase journal, one record per line."""
    from core.journal import as_record
    from state.store import Store, default_url

    for r in Store(store or default_url()).phases(run_id):
        typer.echo(as_record(r).model_dump_json())


@app.command("unknown")
def unknown_cmd(store: Optional[str] = StoreOpt,
                clear: Optional[str] = typer.Option(None, help="clear this target: a person re-verified it"),
                who: Optional[str] = typer.Option(None, help="who re-verified it (default $USER)"),
                reason: str = typer.Option("", help="what was checked")) -> None:
    """List (or clear) targets with a run in the UNKNOWN state; the store's run status is the one record of it."""
    from state.store import Store, default_url

    st = Store(store or default_url())
    try:
        if clear:
            if clear not in st.unknown_targets():
                raise typer.BadParameter(f"target {clear!r} is not UNKNOWN", param_hint="--clear")
            runs = st.clear_unknown(clear, who or os.environ.get("USER") or "tuneloop exec unknown", reason)
            typer.echo(f"{clear}: cleared; run(s) {', '.join(runs)} marked failed (a fault, never a result)")
        for tgt, why in sorted(st.unknown_targets().items()):
            typer.echo(f"{tgt}: {why}")
    finally:
        st.close()


def restore_cmd(station: str = typer.Argument(..., help="station hash (or a run id whose station to restore)"),
                store: Optional[str] = StoreOpt, targets: Optional[Path] = TargetsOpt,
                runs_root: Optional[Path] = RootOpt, holder: Optional[str] = HolderOpt) -> None:
    """Go back to a frozen station: re-deploy exactly its knobs on its goal's own target (a simulated goal on its own
    profile) and check that it is healthy and identical to the frozen station (`differs` says what is not); exit 3
    when it is not both."""
    ex = _executor(store, targets, runs_root, holder)
    try:
        bind_goal(ex, station)
        out = ex.restore(station)
    except LookupError as e:
        raise typer.BadParameter(str(e), param_hint="STATION") from None
    typer.echo(json.dumps(out, indent=1))
    raise typer.Exit(0 if out.get("healthy") and out.get("identical") else 3)


def bind_goal(ex, station: str) -> None:  # type: ignore[no-untyped-def]
    """The executor as the station's goal ran it: a simulated goal on its own `sim_profile`, as the loop binds it
    (executor.runner.Executor.bind_sim_profile). A station whose goal this store does not hold is restored on the
    target as defined (its `differs` then names what that changed)."""
    spec, _ = ex.find_station(station)  # LookupError: no run froze it
    try:
        goal = ex.store.get_goal(spec.goal_id)
    except LookupError:
        return
    ex.bind_sim_profile(goal.spec.target, goal.spec.sim_profile)
