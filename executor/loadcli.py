"""`tuneloop load`: run a load standalone (detached beside a server), summarise and export its raw files."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(no_args_is_help=True, help="Load generator: run, summarize, export.")


def _rate(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise typer.BadParameter(f"--rate {text!r}: a number of requests/s or inf") from None
    if not r > 0:
        raise typer.BadParameter(f"--rate {text!r}: must be > 0 (or inf)")
    return r


@app.command("run")
def run_cmd(
    endpoint: str = typer.Option(..., help="server base URL (http://host:port) or a full /v1/... URL"),
    scenario: str = typer.Option(..., help="scenario name (core/scenarios/ or a directory of $TUNELOOP_DATA_DIRS) or "
                                           "YAML path; a scenario with a `source:` replays a prompt dataset or a "
                                           "trace (its arrival times) beside it"),
    n: int = typer.Option(..., help="formal requests"),
    concurrency: int = typer.Option(..., help="concurrency cap C"),
    rate: str = typer.Option("inf", help="arrival rate r in requests/s, or inf"),
    out: Path = typer.Option(..., help="run directory (created)"),
    warmup: int = typer.Option(0, help="warm-up requests, excluded from the figures"),
    arrival: str = typer.Option("constant", help="constant | poisson | gamma"),
    burstiness: float = typer.Option(1.0, help="gamma shape (1 = Poisson)"),
    api: str = typer.Option("completions", help="completions | chat"),
    model: Optional[str] = typer.Option(None, help="model name; default: the first of /v1/models"),
    cards: int = typer.Option(1, help="cards in use (P + D), for per-card figures"),
    seed: int = typer.Option(0, help="seed of the arrival process"),
    metrics_url: List[str] = typer.Option([], help="NAME=URL of an engine /metrics, once per instance (all scraped "
                                          "concurrently, each within its own timeout); NAME a role "
                                          "(prefill|decode|mixed), one instance of it (decode-1), one rank "
                                          "endpoint of an instance (decode-1.r3) or one node of an instance "
                                          "spanning hosts (decode-1.n2)"),
    timeout_s: float = typer.Option(3600.0, help="per-request timeout (s)"),
    continuous_usage: bool = typer.Option(True, help="ask for usage in every chunk (vLLM continuous_usage_stats)"),
    procs: int = typer.Option(1, help="client processes sharing one schedule and one budget of C (no warm-up)"),
) -> None:
    """Send the scenario's requests; append raw records as they finish; then write rc and done."""
    from core.datafiles import env_dirs, use_data_dirs
    from executor.evidence import parse_endpoints
    from executor.loadgen import LoadConfig, run

    try:
        use_data_dirs(env_dirs())  # a scenario by name may live in a data directory ($TUNELOOP_DATA_DIRS)
        cfg = LoadConfig(endpoint=endpoint, n=n, concurrency=concurrency, request_rate=_rate(rate), warmup=warmup,
                         arrival=arrival, burstiness=burstiness, api=api, model=model, seed=seed,
                         timeout_s=timeout_s, continuous_usage=continuous_usage,
                         metrics_urls=tuple(parse_endpoints(metrics_url)))
        cfg.check()
        if procs < 1 or (procs > 1 and warmup):
            raise ValueError(f"procs={procs}: must be >= 1, and 1 when warmup > 0")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    rc = run(cfg, scenario, out, cards=cards, procs=procs)
    raise typer.Exit(rc)


def resolve_run_dir(path: Path) -> Path:
    """The load's run directory from what a person has: the load's own directory (run.json, requests.jsonl)
    or the experiment's directory the API and the runs root name (`<runs>/<run id>`, the load under `load/`)."""
    from core import records as rec

    if (path / rec.RUN_INFO).is_file():
        return path
    if (path / "load" / rec.RUN_INFO).is_file():
        return path / "load"
    what = "no such directory" if not path.is_dir() else f"neither it nor {path / 'load'} has {rec.RUN_INFO}"
    raise typer.BadParameter(f"{path}: {what} (a load's run directory, or an experiment's under the runs root)",
                             param_hint="RUN_DIR")


@app.command("summarize")
def summarize_cmd(
    run_dir: Path = typer.Argument(..., help="run directory with run.json and requests.jsonl, or an experiment's "
                                             "directory under the runs root (its load/ is used)"),
    json_out: bool = typer.Option(False, "--json", help="print Summary + Verdict as JSON"),
    slo: List[str] = typer.Option([], help="SLO for goodput, e.g. tpot_ms=20"),
) -> None:
    """Summarise (re-runnable) and judge a run directory; exit 3 on a collection failure."""
    from core.metrics import format_summary
    from executor.collect import CollectionError, summarize_run

    slos = {}
    for s in slo:
        k, _, v = s.partition("=")
        try:
            slos[k] = float(v)
        except ValueError:
            raise typer.BadParameter(f"--slo {s!r}: expected name=milliseconds") from None
    try:
        summary, verdict = summarize_run(resolve_run_dir(run_dir), slos=slos or None)
    except (CollectionError, ValueError) as e:
        typer.echo(f"collection_fault: {e}", err=True)
        raise typer.Exit(3)
    if json_out:
        typer.echo(json.dumps({"summary": summary.model_dump(mode="json"), "verdict": verdict.model_dump()}, indent=1))
        return
    typer.echo(format_summary(summary))
    typer.echo(f"verdict: {verdict.kind}")
    for r in verdict.reasons:
        typer.echo(f"  {r.code} ({r.count}): {r.message}")


@app.command("export")
def export_cmd(
    run_dir: Path = typer.Argument(..., help="a load's run directory, or an experiment's directory under the runs "
                                             "root as the API names it (runs/<run id>; its load/ is used)"),
    fmt: str = typer.Option("vllm", "--format", help="vllm (bench serve result JSON) | csv (per request)"),
    out: Optional[Path] = typer.Option(None, help="file to write; default stdout"),
) -> None:
    """Export a run as a `vllm bench serve` result JSON or a per-request CSV."""
    from executor.collect import CollectionError, load_run
    from core import records as rec
    from core.records import EngineSample
    from executor.exports import requests_csv, vllm_result

    if fmt not in ("vllm", "csv"):
        raise typer.BadParameter(f"--format {fmt!r}: vllm or csv")
    try:
        info, records = load_run(resolve_run_dir(run_dir))
    except CollectionError as e:
        typer.echo(f"collection_fault: {e}", err=True)
        raise typer.Exit(3) from None
    if fmt == "vllm":
        samples_file = resolve_run_dir(run_dir) / rec.METRICS  # the engine's counters, when the load scraped them
        samples = list(rec.read_jsonl(samples_file, EngineSample)) if samples_file.is_file() else []
        text = json.dumps(vllm_result(records, info, samples=samples), indent=1,
                          default=lambda x: None if math.isinf(x) else x)
    elif fmt == "csv":
        text = requests_csv(records)
    else:
        raise typer.BadParameter(f"--format {fmt!r}: vllm or csv")
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


if __name__ == "__main__":
    app()
