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
    scenario: str = typer.Option("copy16k-zero-cache", help="scenario name or YAML path; a scenario with a `source:` "
                                                           "replays a dataset or trace beside it (docs/traffic.md)"),
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
def scenarios(data_dir: list[Path] = typer.Option([], "--data-dir", exists=True, file_okay=False,
                                                 help="a data directory (scenarios/, profiles/) listed too, "
                                                      "repeatable")) -> None:
    """List the scenarios (built-in, then those of each --data-dir) with their data version; a scenario of the
    user's own traffic shows its source file, format, request count and timing."""
    from core import datafiles
    from core import scenarios as sc

    datafiles.use_data_dirs(data_dir)
    for name in datafiles.builtin_names("scenarios"):
        try:
            s = sc.load(name)
        except ValueError as e:  # a broken file of a data directory: named, and the rest still listed
            typer.echo(f"{name:24} refused: {e}")
            continue
        if isinstance(s, sc.Traffic):
            src = s.source
            typer.echo(f"{s.name:24} task={s.task:5} source={src.format}:{src.file} requests={len(s.rows)} "
                       f"timing={'trace' if src.replays_times else 'rate'} {s.data_version}")
            continue
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


@app.command()
def calibrate(
    run_dirs: list[Path] = typer.Argument(..., help="measured run directories (a load's run.json + requests.jsonl, "
                                                    "or an executor run directory holding load/)"),
    out: Path = typer.Option(..., "--out", help="write the calibrated profile YAML here"),
    base: Optional[str] = typer.Option(None, help="profile (name or YAML) whose layout and shapes are kept; default: "
                                                  "the one the runs recorded"),
    name: Optional[str] = typer.Option(None, help="the calibrated profile's name (default: BASE-calibrated)"),
    json_out: bool = typer.Option(False, "--json", help="print coefficients, uncertainties and residuals as JSON"),
) -> None:
    """Fit the profile's step-time coefficients (prefill a/b/c, decode a/b/c, draft costs, scheduling) to measured
    runs by least squares over the per-request records and the engine's own iteration series (metrics.jsonl:
    vllm:iteration_tokens_total and num_requests_running per scrape interval), or, for a mixed base profile (one
    vLLM instance prefilling and decoding in the same steps), by replaying each run's arrivals through the
    simulator (TTFT and decode time per request); print each coefficient with its standard error and the
    residuals per run."""
    import yaml

    from core.records import write_atomic
    from simulator import calibrate as cal

    try:
        prof = cal.base_profile(run_dirs, base)
        res = cal.calibrate(run_dirs, prof, name)
    except (cal.CalibrationError, FileNotFoundError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, yaml.safe_dump(res.profile.model_dump(), sort_keys=False))
    rows = res.table()
    per_run = [(p, res.prefill.residuals.get(p), res.decode.residuals.get(p), f) for p, f in zip(res.runs, res.run_factors)]
    if json_out:
        typer.echo(json.dumps({"profile": str(out), "coefficients": [
            {"name": n, "value": v, "stderr": se, "note": note} for n, v, se, note in rows],
            "prefill_from": res.prefill_source, "prompt_tokens": res.profile.calibration.get("prompt_tokens"),
            "runs": [
                {"run": p, "prefill": pr, "decode": dr, "series": res.series.get(p), "run_factor": f}
                for p, pr, dr, f in per_run]}, indent=1))
        return
    typer.echo(f"calibrated {res.profile.name} from {len(res.runs)} run(s) (base {prof.name}; prefill from "
               f"{res.prefill_source}) -> {out}")
    for n, v, se, note in rows:
        rel = f"± {se / v:.1%}" if se is not None and v else "      "
        typer.echo(f"  {n:18} {v:12.5g} {rel:>9}  {note}")
    typer.echo(f"  {cal.tokens_line(res.profile.calibration.get('prompt_tokens'))}")
    typer.echo("residuals per run (relative step time: rms / mean; steps; the engine's iteration series: scrape "
               "intervals, batch range), run time factor:" if not prof.mixed else
               "residuals per run (a mixed engine's replay: relative TTFT as prefill, relative decode time as "
               "decode, per request: rms / mean; requests), run time factor:")
    for p, pr, dr, f in per_run:
        fmt = lambda r: "—" if r is None else f"{r['rms']:.2%} / {r['mean']:+.2%} ({r['steps']})"  # noqa: E731
        sr = res.series.get(p)
        se = f" B {sr['batch_min']:.1f}-{sr['batch_max']:.1f}" if sr else ""
        typer.echo(f"  {p}: prefill {fmt(pr)}, decode {fmt(dr)}, series {fmt(sr)}{se}, factor {f:.4f}")
