"""llama.cpp on this machine: the bundled `llama-server`, the scenario's generated model, a ready targets file.

`tuneloop llamacpp prepare` turns examples/targets-llamacpp.yaml (placeholders @LLAMA_SERVER@, @MODEL@,
@RUN_ROOT@, @PORT@, @PYTHON@) into a targets file with absolute paths, because the launcher starts each service
inside its own service directory. The binary is $TUNELOOP_LLAMA_SERVER, else the llama-server that
`tuneloop llamacpp build` compiled from upstream source with CPU-feature dispatch (executor/engines/llamacpp_build.py; cached
per machine), else one on PATH; any other llama-server can be named with --server. `tuneloop llamacpp selftest` proves the
binary runs on this CPU (make test and make demo-real run it first).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

import typer

from core import scenarios
from executor.engines import llamacpp_build
from executor.engines.llamacpp_model import ensure_model, scenario_recipe
from executor.targets import load_targets

app = typer.Typer(no_args_is_help=True, add_completion=False)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "targets-llamacpp.yaml"


def server_binary() -> str:
    """Absolute path of the llama-server this machine runs: $TUNELOOP_LLAMA_SERVER, else the cached build of
    `tuneloop llamacpp build`, else one on PATH."""
    env = os.environ.get("TUNELOOP_LLAMA_SERVER")
    if env:
        found = shutil.which(env)
        if not found:
            raise FileNotFoundError(f"TUNELOOP_LLAMA_SERVER={env!r}: no such executable")
        return str(Path(found).resolve())
    built = llamacpp_build.cached_binary()
    if built is not None:
        return str(built)
    found = shutil.which("llama-server")
    if not found:
        raise FileNotFoundError(f"llama-server: not built; run `tuneloop llamacpp build` (compiles llama.cpp into "
                                f"{llamacpp_build.cache_root() / llamacpp_build.build_key()}) or put llama-server on PATH")
    return found


def help_flags(help_text: str) -> frozenset[str]:
    """Every flag spelling llama-server's own `--help` lists ("-np,   --parallel N", "--cache-prompt,
    --no-cache-prompt"): an option line starts with '-'; its flags end at the first gap of two spaces."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("-"):
            continue
        head = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line), maxsplit=1)[0]
        flags.update(re.findall(r"(?:^|, )(--?[A-Za-z0-9][\w.-]*)", head))
    return frozenset(flags)


def unknown_flags(argv: Sequence[str], known: frozenset[str]) -> list[str]:
    """The flags in a rendered llama-server argv (after the binary) that its `--help` does not list."""
    return [a for a in argv[1:] if re.fullmatch(r"--?[A-Za-z][\w.-]*", a) and a not in known]


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
                server: Optional[str] = typer.Option(None, help="llama-server binary (default: $TUNELOOP_LLAMA_SERVER, the built one, or PATH)"),
                ) -> None:
    """Generate the model and write a targets file for the local llama-server."""
    info = prepare(out, scenario, port, server)
    for k, v in info.items():
        typer.echo(f"{k}: {v}")


@app.command("stop")
def stop_cmd(out: Path = typer.Option(Path(".tuneloop/demo-real"), help="the directory `prepare` wrote")) -> None:
    """Stop the llama-server(s) left running under OUT (the loop leaves its best station up)."""
    typer.echo(f"stopped process groups: {stop(out) or 'none'}")


@app.command("build")
def build_cmd(cache: Optional[Path] = typer.Option(None, help="cache root (default: $TUNELOOP_LLAMACPP_CACHE, "
                                                              "else /var/cache/tuneloop)"),
              jobs: Optional[int] = typer.Option(None, min=1, help="parallel compile jobs (default: all cores)")) -> None:
    """Build llama-server from the pinned upstream source with CPU-feature dispatch (once per machine) and print
    its path. A cached build is reused."""
    try:
        typer.echo(llamacpp_build.build(cache, jobs, echo=lambda m: typer.echo(m, err=True)))
    except (RuntimeError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)


@app.command("selftest")
def selftest_cmd(server: Optional[str] = typer.Option(None, help="llama-server binary (default: the built one)"),
                 scenario: str = typer.Option("llamacpp-chat", help="scenario whose generated model to complete on"),
                 models: Path = typer.Option(Path(".tuneloop/models"), help="directory for the generated model"),
                 ) -> None:
    """Check that llama-server runs on this CPU: `--version`, no instruction the CPU lacks in the code every start
    loads (nor in the CPU variant the dispatcher picks), and a one-token completion on the generated model. Exits 1
    with the binary's name and the signal when it cannot."""
    try:
        binary = server or server_binary()
        model, _ = model_for(scenario, models)
        info = llamacpp_build.selftest(binary, model)
    except (llamacpp_build.SelfTestError, FileNotFoundError) as e:
        typer.echo(f"llama-server self-test FAILED: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(f"llama-server self-test ok: {info['binary']} ({info['version']}); CPU backend "
               f"{info['cpu_backend'] or 'linked in'}; {len(info['checked'])} libraries checked against this CPU's "
               f"flags; one token: {info['completion']!r}")
