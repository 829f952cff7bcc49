"""The `tuneloop` command: one entry point, one sub-command group per concept."""
from __future__ import annotations

import typer

from executor.loadcli import app as load_app
from simulator.cli import app as sim_app
from simulator.server import serve as _sim_serve

app = typer.Typer(
    name="tuneloop",
    help="Closed-loop performance tuning of LLM inference deployments under a latency limit.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sim_app, name="sim", help="The embedded simulated PD-disaggregated cluster.")
sim_app.command("serve")(_sim_serve)
app.add_typer(load_app, name="load", help="Load generator: run a scenario against an endpoint, summarize, export.")
app.add_typer(__import__("executor.execcli", fromlist=["app"]).app, name="exec", help="Deterministic executor: run, resume.")
app.command("restore")(__import__("executor.execcli", fromlist=["restore_cmd"]).restore_cmd)
app.command("run")(__import__("agent.runcli", fromlist=["run"]).run)
app.command("approve")(__import__("agent.runcli", fromlist=["approve"]).approve)
app.add_typer(__import__("executor.llamacpp", fromlist=["app"]).app, name="llamacpp", help="llama.cpp: generated model, targets file.")
app.command("serve")(__import__("api.cli", fromlist=["serve"]).serve)
app.command("worker")(__import__("api.cli", fromlist=["worker"]).worker)
app.command("report")(__import__("agent.report.cli", fromlist=["report"]).report)


@app.command()
def demo() -> None:
    """Run the tuning loop on the embedded default: simulator target, 16K copy scenario, deterministic
    planner, auto-approval (examples/goal-16k.yaml), with a fresh store under .tuneloop/demo/."""
    import shutil
    from pathlib import Path

    from agent.runcli import run as loop_run

    root = Path(".tuneloop/demo")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    import os

    os.environ.setdefault("TUNELOOP_RUNS_ROOT", str(root / "runs"))
    goal = Path(__file__).resolve().parent / "examples" / "goal-16k.yaml"
    loop_run(goal=goal, db=f"sqlite:///{root / 'tuneloop.db'}", auto_approve=True, llm_base_url=None,
             llm_model="tuneloop-planner", fault=[])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
