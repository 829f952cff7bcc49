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
without a speculative run) keeps the base value and says so. The scheduling share per step is read from the
run's time breakdown when it has one (scheduling seconds / steps), else kept. Each run has a time factor (the
host's speed that minute) with a log-normal prior around 1 (Problem.FACTOR_SIGMA): left free, a factor per run
would absorb any batch slope when every station runs at its own batch, and b would be lost (the real vLLM's first
fit: b ± 434 %, held-out errors 17 %). A real engine tokenises the scenario's words its own way (the generated vLLM
model: about 4 tokens a word): the runs' prompt token counts against the words give the profile's
prompt_tokens_fixed / prompt_tokens_per_word (prompt_tokens), so a prediction sends the prompts the engine saw,
not a token per word (before: the real vLLM's held-out throughput 17.7 % off, 8.0 % with it).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from core import profiles
from core import records as rec
from core import scenarios as sc
from core.profiles import Profile
from core.records import EngineSample, PrefillBatch, RequestRecord, RunInfo
from simulator import calibrate_series as series
from simulator.calibrate_prefill import prefill_steps
from simulator.stations import sim_knobs

DECODE = ("a", "b", "c", "a_draft", "b_draft")
PREFILL = ("a", "b", "c")


class CalibrationError(ValueError):
    """A run directory that cannot be calibrated from (named, with the reason)."""


@dataclass
class Run:
    path: Path
    info: RunInfo
    knobs: dict[str, Any]
    records: list[RequestRecord]
    batches: list[PrefillBatch]
    breakdown: dict[str, Any] | None
    k: int = 0
    decode_steps: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # dt, B, KV, run index
    prefill_steps: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)  # dt, [(n, attn) per rank]
    prefill_source: str = ""
    shared_steps: bool = False  # decode steps read exactly from shared chunk stamps
    samples: list[EngineSample] = field(default_factory=list)  # the engine's scraped metrics (metrics.jsonl)


def load_run(path: Path, base: Profile) -> Run:
    path = Path(path)
    if not (path / rec.RUN_INFO).exists() and (path / "load" / rec.RUN_INFO).exists():
        path = path / "load"  # an executor's run directory: its load lies under load/
    if not (path / rec.RUN_INFO).exists():
        raise CalibrationError(f"{path}: no {rec.RUN_INFO} (not a run directory)")
    info = RunInfo.model_validate_json((path / rec.RUN_INFO).read_text())
    knobs = dict(getattr(info, "knobs", None) or {})
    spec = path.parent / "spec.json"
    if not knobs and spec.exists():
        knobs = dict(json.loads(spec.read_text()).get("knobs") or {})
    knobs = base.knobs(sim_knobs({k: v for k, v in knobs.items() if k not in ("concurrency", "request_rate")})[0])
    records = [r for r in rec.read_jsonl(path / rec.REQUESTS, RequestRecord) if r.ok and len(r.chunk_times) >= 2]
    if not records:
        raise CalibrationError(f"{path}: no finished request with two or more streamed chunks")
    br = json.loads((path / rec.BREAKDOWN).read_text()) if (path / rec.BREAKDOWN).exists() else None
    run = Run(path=path, info=info, knobs=knobs, records=records,
              batches=list(rec.read_jsonl(path / rec.PREFILL_BATCHES, PrefillBatch)), breakdown=br,
              samples=list(rec.read_jsonl(path / rec.METRICS, EngineSample)))
    run.k = int(knobs["num_speculative_tokens"]) if knobs.get("speculative_method", "none") != "none" else 0
    return run


def decode_steps(run: Run, index: int) -> np.ndarray:
    """Rows (dt, B, KV, run index, group), one per decode step (shared stamps: each its own group) or per request
    interval (grouped by request: a client's stamps may bunch, so a request's intervals are fitted as their sum).
    A chunk carrying more tokens than one step can (k + 1: a non-streamed or bunched response) is several steps of
    unknown batch and is left out; the engine's iteration series (simulator.calibrate_series) may still cover it."""
    recs = run.records
    owners: dict[float, list[int]] = {}
    for i, r in enumerate(recs):
        for t in r.chunk_times[1:]:
            owners.setdefault(t, []).append(i)
    shared = sum(1 for v in owners.values() if len(v) > 1) / max(1, len(owners))
    rows: list[tuple[float, float, float, int]] = []
    run.shared_steps = shared >= 0.5 or all(len(v) == 1 for v in owners.values()) and _serial(recs)
    if run.shared_steps:
        prev: dict[tuple[int, float], tuple[float, int]] = {}  # (request, step end) -> (step start, tokens before)
        many: set[float] = set()  # step ends where some request's chunk is more than one step
        for i, r in enumerate(recs):
            toks = r.chunk_tokens or [1] * len(r.chunk_times)
            done = 0
            for j in range(1, len(r.chunk_times)):
                prev[(i, r.chunk_times[j])] = (r.chunk_times[j - 1], done)
                done += toks[j]
                if toks[j] > run.k + 1:
                    many.add(r.chunk_times[j])
        for t, who in owners.items():
            if t in many:
                continue
            start = max(prev[(i, t)][0] for i in who)  # one start in a shared step
            kv = sum((recs[i].n_in or 0) + prev[(i, t)][1] for i in who)
            rows.append((t - start, float(len(who)), float(kv), len(rows)))
    else:
        inst = max(1, int(run.knobs["num_decode_instances"]))
        spans = sorted(((r.chunk_times[0], r.chunk_times[-1], r) for r in recs), key=lambda s: s[:2])
        starts = np.array([s[0] for s in spans])
        ends = np.array([s[1] for s in spans])
        for g, r in enumerate(recs):
            toks = r.chunk_tokens or [1] * len(r.chunk_times)
            for j in range(1, len(r.chunk_times)):
                if toks[j] > run.k + 1:
                    continue
                mid = 0.5 * (r.chunk_times[j - 1] + r.chunk_times[j])
                live = (starts <= mid) & (ends > mid)
                b = float(live.sum())
                kv = sum((s[2].n_in or 0) + _emitted_before(s[2], mid) for s, on in zip(spans, live) if on)
                rows.append((r.chunk_times[j] - r.chunk_times[j - 1], b / inst, kv / inst, g))
    return np.array([(dt, b, kv, index, g) for dt, b, kv, g in rows if dt > 0 or not run.shared_steps],
                    dtype=float).reshape(-1, 5)


def _serial(recs: list[RequestRecord]) -> bool:
    return all(a.chunk_times[-1] <= b.chunk_times[0] for a, b in zip(recs, recs[1:]))


def _emitted_before(r: RequestRecord, t: float) -> int:
    """Tokens of the request generated by steps ended before t (its first token came with prefill)."""
    toks = r.chunk_tokens or [1] * len(r.chunk_times)
    return sum(n for ct, n in zip(r.chunk_times[1:], toks[1:]) if ct < t)


@dataclass
class Fitted:
    role: str
    names: tuple[str, ...]
    values: dict[str, float]
    stderr: dict[str, float | None]
    held: dict[str, str]  # coefficient -> why it kept the base value
    residuals: dict[str, dict[str, float]]  # run path -> {rms, mean, steps} of the relative residuals
    steps: int


def _sched(runs: list[Run], role: str, steps: int) -> float | None:
    """Scheduling seconds per step from the runs' time breakdowns (None when a run has none)."""
    if any(r.breakdown is None or role not in r.breakdown for r in runs):
        return None
    total = sum(float(r.breakdown[role].get("scheduling_s", 0.0)) for r in runs)
    return total / steps if steps else None


class Problem:
    """The decode and prefill step observations of every run, and the profile's step-time shapes over them."""

    def __init__(self, runs: list[Run], base: Profile):
        self.runs, self.base = runs, base
        dc = base.decode_cost
        step_rows = [decode_steps(r, i) for i, r in enumerate(runs)]
        rows = np.vstack(step_rows)
        self.d_dt, self.d_run = rows[:, 0], rows[:, 3].astype(int)
        _, self.d_group = np.unique(rows[:, [3, 4]], axis=0, return_inverse=True)  # steps fitted as sums per group
        self.d_group = self.d_group.ravel()
        self.g_obs = np.bincount(self.d_group, weights=self.d_dt)
        self.g_run = np.zeros(len(self.g_obs), dtype=int)
        self.g_run[self.d_group] = self.d_run
        self.ks = np.array([r.k for r in runs], dtype=float)[self.d_run]
        self.B, self.KV = rows[:, 1], rows[:, 2]
        self.imb, self.save = self._imb_save(self.d_run, self.B)
        srows = [series.series_rows(r.samples, r.records, r.k) for r in runs]  # the engine's iteration series
        for r, x, y in zip(runs, step_rows, srows):
            if not len(x) and not len(y):
                raise CalibrationError(f"{r.path}: no decode step with a positive duration and one token per "
                                       f"request (k + 1 with speculation), and no engine iteration series "
                                       f"({series.ITER} in {rec.METRICS})")
        self.s_run = np.concatenate([np.full(len(x), i) for i, x in enumerate(srows)]).astype(int)
        self.s = np.vstack(srows) if len(self.s_run) else np.zeros((0, len(series.COLUMNS)))
        self.s_ks = np.array([r.k for r in runs], dtype=float)[self.s_run]
        self.s_imb, self.s_save = self._imb_save(self.s_run, self.s[:, 2])
        d_sched = _sched(runs, "decode", len(rows)) if all(r.shared_steps for r in runs) else None
        self.d_sched = dc.sched_s if d_sched is None else d_sched
        self.sched = {"decode": d_sched}
        spec = any(r.k for r in runs)
        self.d_names = ["a", "b", "c"] + (["a_draft", "b_draft"] if spec else [])
        self.held = {} if spec else {f"decode.{n}": "no run with speculative decoding: the draft costs cannot be "
                                                    "separated" for n in ("a_draft", "b_draft")}
        dts, ranks, idx, sources = [], [], [], set()
        for i, r in enumerate(runs):
            steps, src = prefill_steps(r)
            sources.add(src)
            for dt, rk in steps:
                dts.append(dt)
                ranks.append(rk)
                idx.append(i)
        if not dts:  # the prefill coefficients keep the base values, said so
            self.held |= {f"prefill.{n}": "no prefill step observed (no batch records, no request found the prefill "
                                          "idle)" for n in PREFILL}
        self.prefill_source = ", ".join(sorted(sources)) if dts else "nothing observed"
        width = max((len(rk) for rk in ranks), default=1)
        self.p_dt, self.p_run = np.array(dts), np.array(idx)
        self.p_n, self.p_att = np.zeros((len(dts), width)), np.zeros((len(dts), width))
        self.p_cnt, self.p_mask = np.ones((len(dts), width)), np.zeros((len(dts), width), dtype=bool)
        for j, rk in enumerate(ranks):
            for q, item in enumerate(rk):
                self.p_n[j, q], self.p_att[j, q] = item[0], item[1]
                self.p_cnt[j, q] = item[2] if len(item) > 2 else 1
                self.p_mask[j, q] = True
        batches = sum(len({(b.instance.split(".dp")[0], b.t_start) for b in r.batches}) for r in runs)
        self.sched["prefill"] = _sched(runs, "prefill", batches) if batches else None
        self.names = [f"prefill.{n}" for n in PREFILL if dts] + [f"decode.{n}" for n in self.d_names]
        self.scale = np.array([max(self._base(n), 1e-12) for n in self.names])

    def _imb_save(self, run_idx: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the MoE imbalance factor at its batch and the index-cache saving of its run."""
        dc, runs = self.base.decode_cost, self.runs
        imb = np.ones_like(batch)
        if dc.ep > 1:
            n_tok = batch * (np.array([r.k for r in runs], dtype=float)[run_idx] + 1)
            layout = np.array([dc.skew(str(r.knobs["expert_layout"])) for r in runs])[run_idx]
            imb = layout * (1 + np.sqrt(2 * math.log(dc.ep) * dc.ep / (np.maximum(n_tok, 1) * dc.topk)))
        save = np.array([dc.index_cache_reuse_saving if r.knobs.get("index_cache_reuse") else 0.0
                         for r in runs])[run_idx]
        return imb, save

    def _td(self, p: dict[str, float], ks, B, KV, imb, save) -> np.ndarray:
        """The decode step time t_D at each row's batch and resident KV (before the run's time factor)."""
        dc = self.base.decode_cost
        ad, bd = p.get("decode.a_draft", dc.a_draft), p.get("decode.b_draft", dc.b_draft)
        return (self.d_sched + (p["decode.a"] * (1 - save) + p["decode.b"] * B * (ks + 1)
                                + p["decode.c"] * (1 - save) * KV) * imb + ks * (ad + bd * B))

    def _base(self, name: str) -> float:
        role, k = name.split(".")
        return getattr(self.base.prefill_cost if role == "prefill" else self.base.decode_cost, k)

    def unpack(self, x: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
        """Coefficients and each run's time factor (their logs sum to 0: the factors carry no overall scale)."""
        p = dict(zip(self.names, x[:len(self.names)] * self.scale))
        logs = np.concatenate([x[len(self.names):], [-x[len(self.names):].sum()]]) if len(self.runs) > 1 else np.zeros(1)
        return p, np.exp(logs)

    def residuals(self, x: np.ndarray) -> np.ndarray:
        p, f = self.unpack(x)
        pc = self.base.prefill_cost
        pa, pb, pcc = (p.get(f"prefill.{n}", getattr(pc, n)) for n in PREFILL)
        t = pa * self.p_cnt + pb * self.p_n + pcc * self.p_att
        tp = np.where(self.p_mask, t, -np.inf).max(axis=1) * f[self.p_run] if len(self.p_dt) else np.ones(0)
        td = self._td(p, self.ks, self.B, self.KV, self.imb, self.save) * f[self.d_run]
        s = self.s  # per scrape interval: its steps at the mean batch, plus a mixed step's prompt tokens
        ts = (s[:, 1] * self._td(p, self.s_ks, s[:, 2], s[:, 3], self.s_imb, self.s_save)
              + pb * s[:, 4] + pcc * s[:, 4] * s[:, 5] / 2) * f[self.s_run]
        return np.concatenate([self.p_dt / tp - 1.0, self.g_obs / np.bincount(self.d_group, weights=td) - 1.0,
                               s[:, 0] / ts - 1.0, self.f_weight * np.log(f)])

    # a run's time factor: log f ~ N(0, FACTOR_SIGMA²) against rows of noise σ_r, so its MAP residual is σ_r/σ_f·log f
    FACTOR_SIGMA = 0.05
    f_weight = 2.0  # σ_r / σ_f; solve() sets σ_r from the rows of a first fit

    def _fit(self, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Any:
        return least_squares(self.residuals, x0, bounds=(lo, hi), x_scale="jac", method="trf")

    def solve(self) -> tuple[dict[str, float], dict[str, float | None], np.ndarray, np.ndarray]:
        x0 = np.concatenate([np.ones(len(self.names)), np.zeros(max(0, len(self.runs) - 1))])
        lo = np.concatenate([np.zeros(len(self.names)), np.full(max(0, len(self.runs) - 1), -1.0)])
        hi = np.concatenate([np.full(len(self.names), np.inf), np.full(max(0, len(self.runs) - 1), 1.0)])
        sol = self._fit(x0, lo, hi)
        if len(self.runs) > 1:  # the prior weighed by the rows' own noise (a first fit's rms), then fitted again
            self.f_weight = float(np.sqrt(np.mean(sol.fun[:-len(self.runs)] ** 2))) / self.FACTOR_SIGMA
            sol = self._fit(sol.x, lo, hi)
        r = sol.fun
        s2 = float(r @ r) / max(1, len(r) - len(x0))
        try:
            se = np.sqrt(np.clip(np.diag(np.linalg.inv(sol.jac.T @ sol.jac) * s2), 0, None))[:len(self.names)]
            stderr: dict[str, float | None] = {n: float(e * scl) for n, e, scl in zip(self.names, se, self.scale)}
        except np.linalg.LinAlgError:
            stderr = {n: None for n in self.names}
        p, f = self.unpack(sol.x)
        return p, stderr, f, r

    def per_run(self, r: np.ndarray, role: str) -> dict[str, dict[str, float]]:
        n_p, n_d = len(self.p_dt), len(self.g_obs)
        n_s = len(self.s_run)
        res, idx = {"prefill": (r[:n_p], self.p_run), "decode": (r[n_p:n_p + n_d], self.g_run),
                    "series": (r[n_p + n_d:n_p + n_d + n_s], self.s_run)}[role]
        out = {}
        for i, run in enumerate(self.runs):
            m = idx == i
            if m.any() and role == "series":
                out[str(run.path)] = series.summary(self.s[self.s_run == i], res[m])
            elif m.any():
                out[str(run.path)] = {"rms": float(np.sqrt(np.mean(res[m] ** 2))), "mean": float(np.mean(res[m])),
                                      "steps": int(m.sum())}
        return out


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
        return out


CALIBRATED_FROM = " — step times calibrated from "  # the calibrated profile's description: base's + this + N run(s)


def calibrate(run_dirs: list[Path], base: Profile, name: str | None = None) -> Calibration:
    if not run_dirs:
        raise CalibrationError("no run directory given")
    runs = [load_run(p, base) for p in run_dirs]
    if base.mixed:  # prefill and decode share the steps: the runs are replayed (simulator.calibrate_replay)
        prob: Problem = _replay.ReplayProblem(runs, base)
    else:
        prob = Problem(runs, base)
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
            "run_factors": {str(x.path): float(f) for x, f in zip(runs, factors)}, "prompt_tokens": tok}
    words = {} if tok is None else {"prompt_tokens_per_word": tok["per_word"], "prompt_tokens_fixed": tok["fixed"]}
    # a re-calibration (the drift check's suggestion: the base is itself calibrated) says so once, not twice
    stem, desc = base.name.removesuffix("-calibrated"), base.description.split(CALIBRATED_FROM)[0]
    prof = base.model_copy(update={"name": name or f"{stem}-calibrated", "decode_cost": dc, "prefill_cost": pc,
                                   "calibration": info, **words,
                                   "description": f"{desc}{CALIBRATED_FROM}{len(runs)} run(s)"})
    return Calibration(profile=Profile.model_validate(prof.model_dump()), decode=dec, prefill=pre,
                       sched=prob.sched, prefill_source=prob.prefill_source, runs=[str(x.path) for x in runs],
                       run_factors=[float(f) for f in factors], series=prob.per_run(r, "series"))


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


# The replay problem subclasses Problem, and simulator.calibrate_replay imports this module for it: it is imported
# once Problem exists, and used by module (either module may be imported first).
from simulator import calibrate_replay as _replay  # noqa: E402
