"""The calibration's least-squares problem over measured runs (simulator.calibrate fits with it): the runs read
back (Run, load_run), their decode and prefill step rows and the engine's iteration series, the coefficients as
multiples of the base profile's, each run's time factor, and the solve with each coefficient's standard error.
simulator.calibrate_replay subclasses Problem for a mixed engine; simulator.calibrate picks one and builds the
calibrated profile from what it fits.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from core import records as rec
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
        # (request, step end) -> (step start, its KV: prompt + tokens before)
        prev: dict[tuple[int, float], tuple[float, int]] = {}
        many: set[float] = set()  # step ends where some request's chunk is more than one step
        most = run.k + 1
        for i, r in enumerate(recs):
            ts = r.chunk_times
            toks = r.chunk_tokens or [1] * len(ts)
            kv = r.n_in or 0
            for j in range(1, len(ts)):
                prev[(i, ts[j])] = (ts[j - 1], kv)
                kv += toks[j]
                if toks[j] > most:
                    many.add(ts[j])
        for t, who in owners.items():
            if t in many:
                continue
            if len(who) == 1:
                start, kv = prev[(who[0], t)]
            else:
                got = [prev[(i, t)] for i in who]
                start = max([s for s, _ in got])  # one start in a shared step
                kv = sum([k for _, k in got])  # whole token counts: the same integer in any order
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
                               s[:, 0] / ts - 1.0, self.priors(x, f)])

    # a run's time factor: log f ~ N(0, FACTOR_SIGMA²) against rows of noise σ_r, so its MAP residual is σ_r/σ_f·log f
    FACTOR_SIGMA = 0.05
    ROW_SIGMA = 0.1  # σ_r the priors assume until solve() reads it off the rows of a first fit
    f_weight = ROW_SIGMA / FACTOR_SIGMA  # σ_r / σ_f
    # a coefficient, as a multiple x of the base's: x ~ N(1, COEF_SIGMA²), the base right to within about a factor of
    # two. Thousands of step rows outweigh it wherever the runs separate a coefficient; where they do not (decode b
    # and c from one station's batch, b and b_draft at one draft length) it keeps the base's split of the step time
    # the rows fix, instead of wherever the solver's path ends along the direction the rows cannot see
    # (a replayed mixed run keeps what its runs do not identify at the base value instead: calibrate_replay)
    COEF_SIGMA: float | None = 0.7
    c_weight = ROW_SIGMA / COEF_SIGMA  # σ_r / σ_c

    def priors(self, x: np.ndarray, f: np.ndarray) -> np.ndarray:
        """The MAP residuals of the priors: each run's time factor, then each coefficient."""
        coef = self.c_weight * (x[:len(self.names)] - 1.0) if self.COEF_SIGMA else np.zeros(0)
        return np.concatenate([self.f_weight * np.log(f), coef])

    def _fit(self, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Any:
        return least_squares(self.residuals, x0, bounds=(lo, hi), x_scale="jac", method="trf")

    def solve(self) -> tuple[dict[str, float], dict[str, float | None], np.ndarray, np.ndarray]:
        x0 = np.concatenate([np.ones(len(self.names)), np.zeros(max(0, len(self.runs) - 1))])
        lo = np.concatenate([np.zeros(len(self.names)), np.full(max(0, len(self.runs) - 1), -1.0)])
        hi = np.concatenate([np.full(len(self.names), np.inf), np.full(max(0, len(self.runs) - 1), 1.0)])
        sol = self._fit(x0, lo, hi)
        if len(self.runs) > 1 or self.COEF_SIGMA:  # the priors weighed by the rows' own noise (a first fit's rms)
            rms = float(np.sqrt(np.mean(sol.fun[:-len(self.priors(sol.x, self.unpack(sol.x)[1]))] ** 2)))
            self.f_weight = rms / self.FACTOR_SIGMA
            self.c_weight = rms / self.COEF_SIGMA if self.COEF_SIGMA else 0.0
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
