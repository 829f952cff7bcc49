"""`tuneloop sim ...`: run one configuration in virtual time, list profiles/scenarios, evaluate quality."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """["k=v", ...] -> {k: v}; values stay strings, the catalog coerces and names bad ones."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"knob {item!r}: expected name=value")
        out[name.strip()] = value.strip()
    return out


@app.command()
def run(
    profile: str = typer.Option("dsv4-flash-910c-p8d8", help="profile name or YAML path"),
    scenario: str = typer.Option("copy16k-zero-cache", help="scenario name or YAML path"),
    n: int = typer.Option(640, help="formal requests"),
    concurrency: Optional[int] = typer.Option(None, help="concurrency cap C (default: the profile's start)"),
    request_rate: Optional[str] = typer.Option(None, "--rate", "--request-rate", help="req/s or inf"),
    knob: list[str] = typer.Option([], help="server knob name=value (repeatable)"),
    seed: int = typer.Option(0),
    out: Optional[Path] = typer.Option(None, help="write the run directory here"),
    arrival: str = typer.Option("constant", help="constant | poisson | gamma"),
    burstiness: float = typer.Option(1.0),
    warmup: int = typer.Option(0, help="warm-up requests sent (and finished) before the formal ones"),
    fault: list[str] = typer.Option([], help="fault to inject (repeatable), e.g. crash_at=0.5"),
    from_defaults: bool = typer.Option(False, help="start from engine defaults, not the profile's start_knobs"),
    json_out: bool = typer.Option(False, "--json", help="print the summary and truth as JSON"),
) -> None:
    """Simulate one configuration and print a `vllm bench serve`-style summary."""
    from core import profiles
    from core.knobs import KnobError
    from core.metrics import format_summary, summarize
    from simulator import engine
    from simulator.faults import Faults, SimHealthError, SimLaunchError

    try:
        prof = profiles.load(profile)
        overrides = parse_knobs(knob)
        if concurrency is not None:
            overrides["concurrency"] = concurrency
        if request_rate is not None:
            overrides["request_rate"] = request_rate
        knobs = prof.knobs(overrides, start=not from_defaults)
        run_ = engine.simulate(prof, scenario, knobs, n=n, warmup=warmup, seed=seed,
                               faults=Faults.parse(fault), arrival=arrival, burstiness=burstiness)
    except (KnobError, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except (SimLaunchError, SimHealthError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(3)
    if out is not None:
        engine.write_run_dir(run_, out)
    summary = summarize(run_.records, run_.info)
    if json_out:
        typer.echo(json.dumps({"summary": summary.model_dump(exclude={"definitions"}), "truth": run_.truth,
                               "knobs": run_.knobs, "rc": run_.rc}, default=_json_default, indent=1))
    else:
        typer.echo(f"profile {prof.name} · scenario {run_.info.scenario} · seed {seed} · "
                   f"knobs {_changed(prof, run_.knobs)}")
        typer.echo(format_summary(summary))
        if run_.rc:
            typer.echo(f"run crashed (fault): rc={run_.rc}, {len(run_.records)} records kept", err=True)
    if run_.rc:
        raise typer.Exit(run_.rc)


def _json_default(v: Any) -> Any:
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return str(v)


def _changed(prof, knobs: dict[str, Any]) -> str:
    base = prof.knobs()
    diff = {k: v for k, v in knobs.items() if base.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(diff.items())) or "(engine defaults)"


@app.command()
def profiles() -> None:
    """List built-in profiles with their layout and card count."""
    from core import profiles as pr

    for name in pr.names():
        p = pr.load(name)
        typer.echo(f"{name:28} cards={p.cards(p.knobs()):<3} P{p.prefill.instances}x{p.prefill.cards_per_instance}"
                   f" D{p.decode.instances}x{p.decode.cards_per_instance}  {p.description}")


@app.command()
def scenarios() -> None:
    """List built-in scenarios with their data version."""
    from core import scenarios as sc

    for f in sorted(sc.builtin_dir().glob("*.yaml")):
        s = sc.load(f.stem)
        typer.echo(f"{s.name:24} task={s.task:5} in={s.input_len:<7} out={s.output_len:<5} "
                   f"prefix={s.prefix_share:<6g} {s.data_version}")


@app.command()
def quality(
    profile: str = typer.Option("dsv4-flash-910c-p8d8"),
    knob: list[str] = typer.Option([], help="server knob name=value (repeatable)"),
    seed: int = typer.Option(0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate the modelled accuracy of a configuration (the quality gate); exit 1 if it fails."""
    from core import profiles as pr
    from simulator.quality import evaluate

    prof = pr.load(profile)
    res = evaluate(prof, prof.knobs(parse_knobs(knob), start=True), seed=seed)
    typer.echo(res.model_dump_json(indent=1) if json_out else
               f"score {res.score:.4f} baseline {res.baseline:.4f} {'PASS' if res.passed else 'FAIL'} {res.detail}")
    if not res.passed:
        raise typer.Exit(1)
