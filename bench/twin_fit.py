"""The twin's fit on perturbed truths (issue 38): after at most 3 valid runs of the loop, how close are the twin's
step costs to a truth its prior does not describe?

For every bench case and every perturbation seed: the case's profile perturbed (simulator.perturb: each step-cost
coefficient × a seeded factor in [0.6, 1.6], acceptance and imbalance shifted) is the sim target's hidden truth;
the loop runs with the twin on and the case's unperturbed profile as its prior, for 3 experiments (the first
valid runs a goal has). The twin fitted on the first 1, 2 and 3 valid runs (executor/twin.py, the loop's own
fitter) is compared with the truth:

* per coefficient: the relative error of every fitted step cost (a coefficient the runs could not separate keeps
  the prior's value and is listed as held);
* per acceptance and imbalance figure (issue 43 item 3): the relative error of every MTP acceptance α (per task
  type), of the acceptance decay and of every expert layout's imbalance (max/mean EP-rank load) that the fit read
  off the runs' evidence (simulator.calibrate_evidence), beside the prior's own error on it (what a twin that kept
  the prior's would have); what the runs did not observe is listed as held;
* per step: the relative error of the decode step time at each run's own operating points (the batch, resident KV,
  draft positions and expert layout of its steps; the imbalance is the truth's for the truth and the twin's fitted
  one for the twin) and of the prefill time over every prefill step the runs took, each at its own tokens and
  context as the fit reads them (the time at the token budget is printed beside it: a run whose prefix hits never
  fill the budget does not exercise it) — the step costs as the runs exercise them (a coefficient the runs cannot
  separate from another, b from b_draft at one draft width, can be far off while the step is right).

* per figure (issue 43): each of the first 3 valid runs predicted by the twin fitted on the runs before it (the
  first by the prior), out of sample, as the planner scores it (agent/planner/twin.py): the objective in the whole
  window and in the goal's own, every latency at every statistic (the goal's limits among them) and goodput under
  the goal's SLOs; the fitted twin's errors (runs 2 and 3) are what the must-hold reads (median within 10 %).

Prints one line per case × seed and a summary; writes --out/results.json.

    python bench/twin_fit.py                       # the 16 cases, seeds 0-2
    python bench/twin_fit.py --only dsv4-chat2k --seeds 0 1 2 3 4
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = 3  # the must-hold: within 10 % after at most 3 valid runs
LATENCIES = {f"{m}_{s}_ms": (m, s) for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")}
COEFFS = {"decode": ("a", "b", "c", "a_draft", "b_draft"), "prefill": ("a", "b", "c")}


def decode_step(cost: Any, batch: float, kv: float, k: int = 0, layout: str = "none") -> float:
    """t_D at batch B, resident KV tokens and k draft positions, with the layout's expert imbalance (the simulator's
    own formula, simulator/decode.py step_parts)."""
    n_tok = batch * (k + 1)
    imb = 1.0
    if cost.ep > 1 and n_tok:
        imb = cost.skew(layout) * (1 + math.sqrt(2 * math.log(cost.ep) * cost.ep / (n_tok * cost.topk)))
    return cost.sched_s + (cost.a + cost.b * n_tok + cost.c * kv) * imb + k * (cost.a_draft + cost.b_draft * batch)


def prefill_step(cost: Any, tokens: float, ctx: float) -> float:
    return prefill_time(cost, [(tokens, tokens * (ctx + tokens / 2))])


def prefill_points(run_dir: Path, prior: Any) -> list[list[tuple[float, ...]]]:
    """Each prefill step a run took, as the fit reads it (simulator/calibrate_prefill.py: the simulator's batch log,
    else the requests prefilled alone): [(tokens, attention term[, steps]) per DP rank]."""
    from simulator.calibrate_prefill import prefill_steps
    from simulator.calibrate_problem import CalibrationError, load_run

    try:
        steps, _ = prefill_steps(load_run(run_dir, prior))
    except CalibrationError:
        return []
    return [list(ranks) for _, ranks in steps]


def prefill_time(cost: Any, ranks: list[tuple[float, ...]]) -> float:
    """A prefill step's time: its slowest DP rank, a + b n + c Σ n (ctx + n / 2) (a request prefilled alone over
    several steps pays a per step)."""
    return max(cost.a * (r[2] if len(r) > 2 else 1) + cost.b * r[0] + cost.c * r[1] for r in ranks)


def operating_points(run_dir: Path) -> list[tuple[float, float, int, str]]:
    """(batch, resident KV tokens, draft positions, expert layout) at nine instants of a run's decode, from its
    records and its knobs."""
    from core import records as rec
    from core.records import RequestRecord

    d = run_dir / "load" if (run_dir / "load" / rec.REQUESTS).exists() else run_dir
    recs = [r for r in rec.read_jsonl(d / rec.REQUESTS, RequestRecord) if r.ok and len(r.chunk_times) >= 2]
    if not recs:
        return []
    spec = json.loads((run_dir / "spec.json").read_text()) if (run_dir / "spec.json").exists() else {}
    knobs = spec.get("knobs") or {}
    k = int(knobs.get("num_speculative_tokens") or 0) if knobs.get("speculative_method", "none") != "none" else 0
    layout = str(knobs.get("expert_layout") or "none")
    t0, t1 = min(r.chunk_times[0] for r in recs), max(r.chunk_times[-1] for r in recs)
    pts = []
    for i in range(1, 10):  # nine instants across the run: the requests in decode and their context then
        t = t0 + (t1 - t0) * i / 10
        live = [r for r in recs if r.chunk_times[0] <= t <= r.chunk_times[-1]]
        if live:
            kv = sum((r.n_in or 0) + sum(1 for x in r.chunk_times if x <= t) for r in live)
            pts.append((float(len(live)), float(kv), k, layout))
    return pts


def figures_of(goal: Any, s: Any) -> dict[str, float | None]:
    """The figures a goal of any shape may use, read off one Summary: the objective (whole, native), every latency
    at every statistic, goodput under the goal's SLOs (whole window)."""
    view = goal.view()
    out = {"objective (whole)": view.objective(s, "whole"), "objective (native)": view.objective(s, "native"),
           "goodput (whole)": s.whole.goodput if s is not None and s.whole is not None else None}
    for key, (metric, stat) in LATENCIES.items():
        out[key] = getattr(getattr(s, f"{metric}_ms"), stat) if s is not None else None
    return out


def figure_errors(goal: Any, valid: list[Any], twins: Any) -> dict[str, list[float]]:
    """figure -> the out-of-sample relative errors of runs 2.. (each predicted by the twin fitted on the runs
    before it); run 1, predicted by the prior, is left out (it measures the prior, not the fit)."""
    out: dict[str, list[float]] = {}
    slos = goal.view().slos() or None
    for k in range(1, len(valid)):
        fit = twins.fit(goal.sim_profile, tuple(o.run_id for o in valid[:k]))
        if isinstance(fit, str):
            continue
        o = valid[k]
        p = fit.predict(goal.scenario, o.card.knobs, o.card.n, goal.protocol.warmup, goal.protocol.seeds[0],
                        slos=slos, native=(goal.protocol.native_min_requests, goal.protocol.native_min_seconds))
        got, want = figures_of(goal, p["summary"]), figures_of(goal, o.summary)
        for name, y in want.items():
            if y and got.get(name):
                out.setdefault(name, []).append(got[name] / y - 1.0)
    return out


def one(case: Any, seed: int, work: Path) -> dict[str, Any]:
    from agent.loop.record import build_history
    from agent.loop.session import run_session
    from agent.planner import runs_of
    from core import profiles
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import Target
    from executor.twin import Twin
    from simulator import perturb
    from simulator.calibrate_evidence import value_of
    from state.store import Store

    goal = case.goal_spec(False, 0)
    goal = goal.model_copy(update={"budget": goal.budget.model_copy(update={"experiments": RUNS})})
    prior = profiles.load(goal.sim_profile)
    truth = perturb.perturb(prior, seed)
    path = perturb.write(truth, work / "truths" / f"{case.name}-{seed}.yaml")
    url = f"sqlite:///{work / 'tuneloop.db'}"
    st = Store(url)
    try:
        ex = Executor(st, {goal.target: Target(name=goal.target, kind="sim", engine="sim", profile=goal.sim_profile,
                                               truth_profile=path)},
                      settings=ExecSettings.from_env(runs_root=work / "runs"))
        res = run_session(goal, url, auto_approve=True, executor=ex, twin=True, who="twin-fit bench")
        valid = runs_of(build_history(st, res.goal_id))[:RUNS]
        runs = [o.run_id for o in valid]
    finally:
        st.close()
    out: dict[str, Any] = {"case": case.name, "seed": seed, "profile": prior.name, "runs": len(runs),
                           "factors": perturb.factors_of(truth), "fits": [],
                           "figures": figure_errors(goal, valid, ex.twins)}
    pts = [p for r in runs for p in operating_points(work / "runs" / r)]
    psteps = [s for r in runs for s in prefill_points(work / "runs" / r, prior) if s]
    budget = float(goal.start_station().get("max_num_batched_tokens") or 8192)
    for k in range(1, len(runs) + 1):
        fit = ex.twins.fit(goal.sim_profile, tuple(runs[:k]))
        if not isinstance(fit, Twin):
            out["fits"].append({"runs": k, "error": fit})
            continue
        coeffs, held, spec = {}, [], {}
        for (name, value, _se, note) in fit.table:
            role, c = name.split(".", 1) if "." in name else (name, "")
            if role == "acceptance" or role == "acceptance_decay" or c.startswith("if_static."):
                true = value_of(truth, name)
                if not note.startswith("fitted"):
                    held.append(name)
                elif true:  # the fit's error, and the prior's (a twin that kept it)
                    spec[name] = {"fitted": value / true - 1, "prior": value_of(prior, name) / true - 1}
                continue
            if c not in COEFFS.get(role, ()):
                continue
            true = getattr(getattr(truth, f"{role}_cost"), c)
            if note != "fitted":
                held.append(name)
            elif true:
                coeffs[name] = value / true - 1
        dstep = [decode_step(fit.profile.decode_cost, b, kv, k, lay) / decode_step(truth.decode_cost, b, kv, k, lay) - 1
                 for b, kv, k, lay in pts]
        at_budget = prefill_step(fit.profile.prefill_cost, budget, 0) / prefill_step(truth.prefill_cost, budget, 0) - 1
        # the prefill time the runs spent, fitted against true: every step they took at its own tokens and context
        true_s = sum(prefill_time(truth.prefill_cost, s) for s in psteps)
        pstep = sum(prefill_time(fit.profile.prefill_cost, s) for s in psteps) / true_s - 1 if true_s > 0 else at_budget
        out["fits"].append({"runs": k, "coefficients": coeffs, "held": held, "evidence": spec,
                            "decode_step_max": max((abs(x) for x in dstep), default=None),
                            "prefill_step": pstep, "prefill_step_at_budget": at_budget,
                            "prefill_steps_read": len(psteps)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=str(ROOT / "bench" / "scenarios.yaml"))
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(ROOT / "bench" / ".cache" / "twin_fit"))
    args = ap.parse_args()
    from bench.tuners.cases import load_cases

    cases = [c for c in load_cases(args.cases).cases if not args.only or c.name in args.only]
    rows = []
    for case in cases:
        for seed in args.seeds:
            with tempfile.TemporaryDirectory(prefix="twin-fit-") as tmp:
                r = one(case, seed, Path(tmp))
            rows.append(r)
            last = r["fits"][-1] if r["fits"] else {}
            coeff = last.get("coefficients") or {}
            worst = max(coeff.items(), key=lambda kv: abs(kv[1]), default=("-", 0.0))
            ds, ps, pb = last.get("decode_step_max"), last.get("prefill_step"), last.get("prefill_step_at_budget")
            print(f"{case.name:40s} seed {seed}: {r['runs']} valid run(s); after {last.get('runs')}: "
                  f"decode step max {ds if ds is None else f'{ds:+.1%}'}, prefill steps {ps if ps is None else f'{ps:+.1%}'}"
                  f" (at the budget {pb if pb is None else f'{pb:+.1%}'}); "
                  f"worst coefficient {worst[0]} {worst[1]:+.1%}; held {','.join(last.get('held') or []) or '-'}"
                  + (f"; {last['error']}" if "error" in last else ""), flush=True)
            figs = r["figures"]
            shown = ["objective (whole)", "objective (native)", "goodput (whole)", "ttft_p99_ms", "tpot_mean_ms",
                     "tpot_p99_ms", "e2e_p99_ms"]
            ev = last.get("evidence") or {}
            if ev:
                print("    evidence: " + ", ".join(f"{k} {v['fitted']:+.1%} (prior {v['prior']:+.1%})"
                                             for k, v in ev.items()), flush=True)
            print("    out of sample: " + ", ".join(f"{k} {', '.join(f'{e:+.1%}' for e in figs[k])}"
                                                 for k in shown if figs.get(k)), flush=True)
    steps = [max(abs(f["decode_step_max"] or 0), abs(f["prefill_step"] or 0)) for r in rows for f in r["fits"][-1:]
             if "coefficients" in f]
    within = sum(s <= 0.10 for s in steps)
    decode_c = [abs(v) for r in rows for f in r["fits"][-1:] for k, v in (f.get("coefficients") or {}).items()
                if k.startswith("decode.")]
    print(f"\nafter <= {RUNS} valid runs: step times within 10 % of the truth in {within}/{len(steps)} case x seed; "
          f"median |error| of the fitted decode coefficients {statistics.median(decode_c) if decode_c else float('nan'):.1%}, "
          f"share within 10 % {sum(x <= 0.10 for x in decode_c)}/{len(decode_c)}")
    evs: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        for f in r["fits"][-1:]:
            for k, v in (f.get("evidence") or {}).items():
                kind = k.split(".")[0] if k.startswith("acceptance") else "decode.if_static"
                for who in ("fitted", "prior"):
                    evs.setdefault(kind, {}).setdefault(who, []).append(abs(v[who]))
    for kind, e in evs.items():
        print(f"  {kind}: median |error| fitted {statistics.median(e['fitted']):.1%} (the prior's "
              f"{statistics.median(e['prior']):.1%}), within 2 % {sum(x <= 0.02 for x in e['fitted'])}/{len(e['fitted'])}")
    per: dict[str, list[float]] = {}
    for r in rows:
        for k, errs in r["figures"].items():
            per.setdefault(k, []).extend(abs(e) for e in errs)
    print(f"out-of-sample |error| per figure after <= {RUNS} valid runs (runs 2..{RUNS}, case x seed pooled): median, "
          f"share within 10 %")
    for k, errs in per.items():
        print(f"  {k:20s} {statistics.median(errs):6.1%}  {sum(e <= 0.10 for e in errs)}/{len(errs)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
