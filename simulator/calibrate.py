"""Fit a profile's step-time coefficients to measured runs (`tuneloop sim calibrate RUN_DIR... --out P.yaml`).

Decode steps are read from the per-request records: each streamed chunk after the first is one decode step, so a
chunk interval is a step's duration. Requests whose chunk times coincide (the simulator; any engine that stamps
chunks per step) share their steps exactly, and the step's batch B and resident KV are counted from the
requests resident in it; where stamps never coincide (a real engine seen from the client) every request's own
interval is a step and B, KV are the requests in decode at its midpoint, spread evenly over the decode
instances. Prefill steps are the engine's per-step batch records where the run has them (tokens per request per
rank; the attention context of a request's later chunks follows from its earlier ones), else the TTFT of
requests that found the prefill idle (prefilled alone: ceil(U / budget) steps over their U uncached tokens).
The engine's own iteration statistics add one residual per scrape interval of a busy decode (or mixed) instance:
the interval's steps (vllm:iteration_tokens_total) at their mean batch predict its length
(simulator.calibrate_series), so the batch series identifies the decode coefficients even from records that are
not streamed (a chunk of several steps is left out of the per-step rows). A mixed base profile (prefill chunks and
decode in the same steps: one vLLM instance) is fitted instead by replaying each run's arrivals through the
simulator inside the residual (simulator.calibrate_replay): there, no step is a pure prefill or decode step.

The shapes are the profile's own (core.profiles): t_D = sched + (a + b·B(k+1) + c·KV)·IF + k(a_draft + b_draft·B),
t_P = max over DP ranks of a + b·Σn + c·Σ n(ctx + n/2). scipy.optimize.least_squares fits the coefficients as
multiples of the base profile's on relative residuals (the noise is multiplicative); each coefficient's standard
error is from the Jacobian at the solution, s²·(JᵀJ)⁻¹. A coefficient the runs cannot separate (the draft costs
without a speculative run) keeps the base value and says so. The scheduling share per step is read from the run's
time breakdown when it has one (scheduling seconds / steps), else kept. Each run has a time factor (the host's
speed that minute) with a log-normal prior around 1 (Problem.FACTOR_SIGMA): left free, a factor per run would
absorb any batch slope when every station runs at its own batch, and b would be lost (the real vLLM's first fit: b
± 434 %, held-out errors 17 %). Each coefficient has a prior too, the base's value within about a factor of two
(Problem.COEF_SIGMA): thousands of step rows outweigh it wherever the runs separate the coefficients, and where
they do not (one station's run at one draft length: b and b_draft, a and a_draft move together) it keeps the base's
split of the step time the rows fix (before: b -100 %, b_draft +140 % from one run of a perturbed truth). A real
engine tokenises the scenario's words its own way (the generated vLLM model: about 4 tokens a word): the runs'
prompt token counts against the words give the profile's prompt_tokens_fixed / prompt_tokens_per_word
(prompt_tokens), so a prediction sends the prompts the engine saw, not a token per word (before: the real vLLM's
held-out throughput 17.7 % off, 8.0 % with it).

Before the step costs, the runs' evidence gives what the step times do not (simulator.calibrate_evidence): the MTP
acceptance α per task type and its decay per draft position from `spec_accept_per_position`, and each expert
layout's imbalance (if_static) from `expert_load_spread`; the step fit then reads the fitted imbalance. What no run
observed (a task no speculative run had, a layout no run used) keeps the base value and its table row says so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core import profiles
from core import records as rec
from core import scenarios as sc
from core.profiles import Profile
from simulator.calibrate_evidence import EvidenceFit, fit_evidence
from simulator.calibrate_problem import DECODE, PREFILL, CalibrationError, Fitted, Problem, Run, load_run
from simulator.calibrate_replay import ReplayProblem


@dataclass
class Calibration:
    profile: Profile
    decode: Fitted
    prefill: Fitted
    sched: dict[str, float | None]
    prefill_source: str
    runs: list[str]
    run_factors: list[float] = field(default_factory=list)  # each run's common time factor (logs sum to 0)
    series: dict[str, dict[str, float]] = field(default_factory=dict)  # run -> its iteration-series residuals
    evidence: EvidenceFit = field(default_factory=EvidenceFit)  # acceptance and imbalance (calibrate_evidence)

    def table(self) -> list[tuple[str, float, float | None, str]]:
        """(coefficient, value, standard error, note) for every fitted or held coefficient."""
        out = []
        for f, names in ((self.prefill, PREFILL), (self.decode, DECODE)):
            cost = self.profile.prefill_cost if f.role == "prefill" else self.profile.decode_cost
            for n in names:
                out.append((f"{f.role}.{n}", getattr(cost, n), f.stderr.get(n), f.held.get(n, "fitted")))
            s = self.sched[f.role]
            note = "from the time breakdown (scheduling s / steps)" if s is not None else "kept: no breakdown"
            if self.profile.mixed and f.role == "prefill":
                note = "kept: a mixed engine's step is scheduled once (decode.sched_s)"
            out.append((f"{f.role}.sched_s", cost.sched_s, None, note))
        return out + self.evidence.rows


CALIBRATED_FROM = " — step times calibrated from "  # the calibrated profile's description: base's + this + N run(s)


def calibrate(run_dirs: list[Path], base: Profile, name: str | None = None) -> Calibration:
    if not run_dirs:
        raise CalibrationError("no run directory given")
    runs = [load_run(p, base) for p in run_dirs]
    ev = fit_evidence(runs, base)  # acceptance and imbalance first: the step fit reads the runs' own imbalance
    fit_base = ev.apply(base)
    if base.mixed:  # prefill and decode share the steps: the runs are replayed (simulator.calibrate_replay)
        prob: Problem = ReplayProblem(runs, fit_base)
    else:
        prob = Problem(runs, fit_base)
    values, stderr, factors, r = prob.solve()
    fitted = {}
    for role in ("prefill", "decode"):
        mine = tuple(n.split(".")[1] for n in prob.names if n.startswith(role))
        fitted[role] = Fitted(role, mine, {k: values[f"{role}.{k}"] for k in mine},
                              {k: stderr[f"{role}.{k}"] for k in mine},
                              {k.split(".")[1]: v for k, v in prob.held.items() if k.startswith(role)},
                              prob.per_run(r, role), int(len(prob.p_dt) if role == "prefill" else len(prob.g_obs)))
    dec, pre = fitted["decode"], fitted["prefill"]
    d_s, p_s = prob.sched["decode"], prob.sched["prefill"]
    held = prob.base  # the base with what the fit held at a bounded value (calibrate_replay), else the base itself
    dc = held.decode_cost.model_copy(update=dec.values | ({"sched_s": d_s} if d_s is not None else {}))
    pc = held.prefill_cost.model_copy(update=pre.values | ({"sched_s": p_s} if p_s is not None else {}))
    tok = prompt_tokens(runs)
    info = {"from_runs": [str(x.path) for x in runs], "base_profile": base.name, "stderr": stderr,
            "held": prob.held, "prefill_from": prob.prefill_source,
            "run_factors": {str(x.path): float(f) for x, f in zip(runs, factors)}, "prompt_tokens": tok,
            "evidence": ev.info}
    words = {} if tok is None else {"prompt_tokens_per_word": tok["per_word"], "prompt_tokens_fixed": tok["fixed"]}
    # a re-calibration (the drift check's suggestion: the base is itself calibrated) says so once, not twice
    stem, desc = base.name.removesuffix("-calibrated"), base.description.split(CALIBRATED_FROM)[0]
    prof = fit_base.model_copy(update={"name": name or f"{stem}-calibrated", "decode_cost": dc, "prefill_cost": pc,
                                   "calibration": info, **words,
                                   "description": f"{desc}{CALIBRATED_FROM}{len(runs)} run(s)"})
    return Calibration(profile=Profile.model_validate(prof.model_dump()), decode=dec, prefill=pre,
                       sched=prob.sched, prefill_source=prob.prefill_source, runs=[str(x.path) for x in runs],
                       run_factors=[float(f) for f in factors], series=prob.per_run(r, "series"), evidence=ev)


def prompt_tokens(runs: list[Run]) -> dict[str, Any] | None:
    """How the measured engine tokenised the scenario's prompts: least squares of its prompt tokens (the records'
    n_in, the engine's usage counts) on the scenario's words per request (the same seeded requests the load
    generator sent), tokens = fixed + per_word × words; per_word alone when the fixed part comes out negative or
    every prompt has the same word count. None when no run's scenario (at its version) is installed here."""
    words, tokens = [], []
    for r in runs:
        try:
            scen = sc.load(r.info.scenario)
        except Exception:
            continue
        if scen.version != r.info.scenario_version:
            continue
        measured = [x for x in r.records if x.n_in is not None]
        if not measured:
            continue
        specs = sc.generate(scen, max(x.id for x in measured) + 1)
        words += [specs[x.id].n_in for x in measured]
        tokens += [x.n_in for x in measured]
    if not words:
        return None
    w, t = np.array(words, dtype=float), np.array(tokens, dtype=float)
    fixed, per_word = 0.0, float(t.sum() / w.sum())
    if np.ptp(w) > 0:
        slope, icpt = np.polyfit(w, t, 1)
        if icpt >= 0 and slope > 0:
            fixed, per_word = float(icpt), float(slope)
    pred = fixed + per_word * w
    return {"per_word": round(per_word, 4), "fixed": round(fixed, 3), "requests": len(w),
            "rms_tokens": round(float(np.sqrt(np.mean((t - pred) ** 2))), 3)}


def tokens_line(tok: dict[str, Any] | None) -> str:
    """The calibration's prompt tokenisation in one line."""
    if tok is None:
        return "prompt tokens: no run's scenario installed here: the simulator's own count kept (a token per word)"
    return (f"prompt tokens = {tok['fixed']:g} + {tok['per_word']:g} x words (the engine's counts over "
            f"{tok['requests']} requests, rms {tok['rms_tokens']:g} tokens): predictions send these prompts")


def base_profile(run_dirs: list[Path], name: str | None) -> Profile:
    """The profile named, else the one the first run recorded (a simulated run does)."""
    if name:
        return profiles.load(name)
    for p in run_dirs:
        for d in (Path(p), Path(p) / "load"):
            f = d / rec.RUN_INFO
            if f.exists():
                prof = json.loads(f.read_text()).get("profile")
                if prof:
                    return profiles.load(prof)
    raise CalibrationError("--base: the runs do not name a simulator profile; give the profile to start from")


__all__ = ["CalibrationError", "Calibration", "DECODE", "PREFILL", "Run", "base_profile", "calibrate", "load_run",
           "prompt_tokens", "tokens_line"]
