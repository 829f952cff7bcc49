"""Calibration of a mixed engine (core.profiles `mixed`: vLLM prefilling and decoding in the same steps) by replaying
each measured run through the simulator inside the least-squares residual (simulator.calibrate).

On a mixed engine no request finds the prefill idle and no step is a pure prefill or a pure decode step: a prompt's
chunks ride in the running requests' decode steps and lengthen them, so neither the chunk intervals (a step's
decode share plus some chunks of unknown size) nor TTFTs alone isolate a coefficient. What the records do fix is
the load: the requests the client sent (prompt and output tokens, in order), its arrival schedule (t_sched) and the
concurrency cap. The replay sends the same requests on the same schedule under the same cap to a simulated mixed
engine at the run's knobs (max_num_seqs, max_num_batched_tokens) with candidate coefficients (no noise), so the
engine's scheduler decides which chunks share which step exactly as the measured engine's did; each request gives
two rows, its TTFT and its decode time (first to last token), predicted against measured. TTFT carries the prefill
cost under overlap (the chunks of the request and of those ahead of it, the decode steps they ride in), the decode
time carries the decode cost and the prefill chunks that slowed it. The arrivals follow the replay's own finishes
(closed loop), so a coefficient moves every time continuously and the scheduling stays consistent; the residual is
still piecewise (a chunk that no longer fits moves to the next step), so the Jacobian is taken by finite
differences of REL_STEP, wide enough to step over single reorderings. Each run's time factor scales all of its
coefficients (the host's speed that minute, as in the step fit). The per-step rows and the engine's iteration
series are left out on a mixed engine: their steps carry prompt chunks the rows cannot size.

Uncertainty: the requests of a closed loop share steps, so their rows are not independent and s²·(JᵀJ)⁻¹
understates the spread (about 2× on the simulator's own runs over seeds); each coefficient reports the larger of
that and the cluster-robust (sandwich) error over blocks of C consecutive requests per run. A coefficient whose
error exceeds its value at a first fit (the prefill's attention term when every prompt is a few tokens) keeps the
base value, said so, and the rest is fitted again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from core import records as rec
from core import scenarios as sc
from core.profiles import Profile
from core.records import RequestRecord
from simulator import calibrate_series as series
from simulator import engine
from simulator.calibrate_problem import PREFILL, CalibrationError, Problem

REL_STEP = 0.01  # finite-difference step of the Jacobian, relative to each coefficient


@dataclass
class Replay:
    """One measured run as the replay sends it again, and the measured figures it is compared with."""

    run: Any
    specs: list[sc.RequestSpec]
    warmup: int
    offsets: list[float]
    ids: np.ndarray  # request ids of the rows, in order
    ttft: np.ndarray  # measured TTFT per row
    dec_ids: np.ndarray
    dec: np.ndarray  # measured first-to-last token time per request with two tokens or more
    scenario: sc.Scenario


def _scenario(name: str, version: int, output_len: int | None, task: str) -> sc.Scenario:
    try:
        return sc.load(name)
    except Exception:  # the run's scenario is not installed here: only its task matters to the replay
        return sc.Scenario(name=name, version=version, task=task, input_len=1, output_len=output_len or 1)


def prepare(run: Any, base: Profile) -> Replay:
    """The run's requests (every finished one, warm-up first, then in schedule order) and the formal ones' measured
    figures."""
    recs = [r for r in rec.read_jsonl(run.path / rec.REQUESTS, RequestRecord) if r.ok and r.chunk_times]
    for r in recs:
        for name in ("t_send", "n_in", "n_out"):
            if getattr(r, name) is None:
                raise CalibrationError(f"{run.path}: request {r.id} has no {name}: a mixed engine's run is replayed from every "
                            f"request's {name}")
    warm = sorted((r for r in recs if r.warmup), key=lambda r: (r.t_sched, r.id))
    formal = sorted((r for r in recs if not r.warmup), key=lambda r: (r.t_sched, r.id))
    if not formal:
        raise CalibrationError(f"{run.path}: no finished formal request to replay")
    specs = [sc.RequestSpec(id=r.id, n_in=int(r.n_in), n_out=max(1, int(r.n_out)), prefix_group=None, prefix_len=0)
             for r in warm + formal]
    t0 = formal[0].t_sched
    rows = formal  # the warm-up requests are replayed, not compared: they carry a fresh engine's first-call costs
    multi = [r for r in rows if len(r.chunk_times) >= 2]
    info = run.info
    return Replay(run=run, specs=specs, warmup=len(warm), offsets=[r.t_sched - t0 for r in formal],
                  ids=np.array([r.id for r in rows]), ttft=np.array([r.chunk_times[0] - r.t_send for r in rows]),
                  dec_ids=np.array([r.id for r in multi]),
                  dec=np.array([r.chunk_times[-1] - r.chunk_times[0] for r in multi]),
                  scenario=_scenario(info.scenario, info.scenario_version, info.output_len, base.default_task))


def profile_at(base: Profile, values: dict[str, float], factor: float) -> Profile:
    """The base profile with the candidate coefficients, every step cost times the run's factor, and no noise."""
    pc, dc = base.prefill_cost, base.decode_cost
    p = {k: values.get(f"prefill.{k}", getattr(pc, k)) * factor for k in ("a", "b", "c", "sched_s")}
    d = {k: values.get(f"decode.{k}", getattr(dc, k)) * factor for k in ("a", "b", "c", "a_draft", "b_draft", "sched_s")}
    return base.model_copy(update={"prefill_cost": pc.model_copy(update=p), "decode_cost": dc.model_copy(update=d),
                                   "noise_run_sigma": 0.0, "noise_step_sigma": 0.0})


def simulate(rp: Replay, prof: Profile, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(predicted TTFT, predicted decode time) per row of the replayed run."""
    run = rp.run
    knobs = dict(run.knobs) | {"concurrency": int(run.info.concurrency), "request_rate": float(run.info.request_rate)}
    out = engine.simulate(prof, rp.scenario, knobs, n=len(rp.offsets), warmup=rp.warmup, seed=seed,
                          requests=rp.specs, offsets=rp.offsets, observe=False)
    by_id = {r.id: r for r in out.records}
    ttft = np.array([by_id[i].chunk_times[0] - by_id[i].t_send for i in rp.ids])
    dec = np.array([by_id[i].chunk_times[-1] - by_id[i].chunk_times[0] for i in rp.dec_ids])
    return ttft, dec


def steps_run(samples: list[Any]) -> float | None:
    """Engine steps over the run (vLLM's iteration_tokens_total count at the last scrape, summed over engines)."""
    last: dict[str, float] = {}
    for s in sorted(samples, key=lambda s: s.t):
        v = series.total(s.values, f"{series.ITER}_count")
        if v is not None:
            last[s.instance] = v
    return sum(last.values()) if last else None


class ReplayProblem(Problem):
    """The mixed runs' replay rows, fitted and reported as simulator.calibrate.Problem's step rows are."""

    COEF_SIGMA = None  # what the runs do not identify is kept at the base value (solve), not drawn towards it

    def __init__(self, runs: list[Any], base: Profile):  # noqa: super().__init__ would build the step rows
        self.runs, self.base = runs, base
        self.replays = [prepare(r, base) for r in runs]
        spec = any(r.k for r in runs)
        d_names = ["a", "b", "c"] + (["a_draft", "b_draft"] if spec else [])
        self.held = {} if spec else {f"decode.{n}": "no run with speculative decoding: the draft costs cannot be "
                                                    "separated" for n in ("a_draft", "b_draft")}
        self.names = [f"prefill.{n}" for n in PREFILL] + [f"decode.{n}" for n in d_names]
        self.scale = np.array([max(self._base(n), 1e-12) for n in self.names])
        self.prefill_source = "replay of the measured arrivals through the mixed engine (TTFT and decode time)"
        self.p_dt = np.concatenate([rp.ttft for rp in self.replays])
        self.g_obs = np.concatenate([rp.dec for rp in self.replays])
        self.p_run = np.concatenate([np.full(len(rp.ttft), i) for i, rp in enumerate(self.replays)]).astype(int)
        self.g_run = np.concatenate([np.full(len(rp.dec), i) for i, rp in enumerate(self.replays)]).astype(int)
        self.s_run = np.zeros(0, dtype=int)
        steps = [steps_run(r.samples) for r in runs]
        d_sched = None
        if all(r.breakdown and "decode" in r.breakdown for r in runs) and all(steps):
            d_sched = sum(float(r.breakdown["decode"].get("scheduling_s", 0.0)) for r in runs) / sum(steps)
        self.sched = {"decode": d_sched, "prefill": None}
        if d_sched is not None:
            self.base = base.model_copy(update={"decode_cost": base.decode_cost.model_copy(update={"sched_s": d_sched})})
        self._cache: dict[tuple[int, tuple[float, ...]], tuple[np.ndarray, np.ndarray]] = {}

    def _predict(self, i: int, p: dict[str, float], f: float) -> tuple[np.ndarray, np.ndarray]:
        key = (i, tuple(round(v * f, 15) for v in p.values()))  # a factor's step reruns only the runs it moves
        if key not in self._cache:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = simulate(self.replays[i], profile_at(self.base, p, f))
        return self._cache[key]

    def residuals(self, x: np.ndarray) -> np.ndarray:
        p, f = self.unpack(x)
        ttft, dec = [], []
        for i, rp in enumerate(self.replays):
            t, d = self._predict(i, p, float(f[i]))
            ttft.append(rp.ttft / np.maximum(t, 1e-9) - 1.0)
            dec.append(rp.dec / np.maximum(d, 1e-9) - 1.0)
        return np.concatenate(ttft + dec + [self.priors(x, f)])

    def _jac(self, x: np.ndarray) -> np.ndarray:
        r0 = self.residuals(x)
        n = len(self.names)
        cols = []
        for j in range(len(x)):
            h = REL_STEP * max(abs(x[j]), 1e-3) if j < n else REL_STEP
            xp = x.copy()
            xp[j] += h
            cols.append((self.residuals(xp) - r0) / h)
        return np.array(cols).T

    def _fit(self, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Any:
        self._sol = least_squares(self.residuals, np.clip(x0, lo + 1e-9, hi), jac=self._jac, bounds=(lo, hi),
                                  x_scale="jac", method="trf", max_nfev=60)
        return self._sol

    def _clusters(self) -> np.ndarray:
        """Per residual row, its block: the requests of one run sent in the same window of C (a closed loop's
        neighbours share the steps, so their rows err together); each prior row alone."""
        out, blocks = [], 0
        for rows in ("ttft", "dec"):
            start = 0
            for rp in self.replays:
                c = max(1, int(rp.run.info.concurrency))
                order = {i: j for j, i in enumerate(rp.ids)}
                ids = rp.ids if rows == "ttft" else rp.dec_ids
                out.append(start + np.array([order[i] // c for i in ids]))
                start += len(rp.ids) // c + 1
            blocks = max(blocks, start)
        return np.concatenate(out + [blocks + np.arange(len(self.runs))])

    def robust_stderr(self) -> dict[str, float | None]:
        """Standard errors from the cluster-robust (sandwich) covariance over _clusters: (JᵀJ)⁻¹ Σ_g J_gᵀr_g r_gᵀJ_g
        (JᵀJ)⁻¹, whose blocks carry the correlation the plain s²·(JᵀJ)⁻¹ misses."""
        jac, r = self._sol.jac, self._sol.fun
        g = self._clusters()
        score = np.zeros((g.max() + 1, jac.shape[1]))
        np.add.at(score, g, jac * r[:, None])
        try:
            inv = np.linalg.inv(jac.T @ jac)
        except np.linalg.LinAlgError:
            return {n: None for n in self.names}
        n_g = len(np.unique(g))
        cov = inv @ (score.T @ score) @ inv * n_g / max(1, n_g - 1)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))[:len(self.names)]
        return {n: float(e * sc) for n, e, sc in zip(self.names, se, self.scale)}

    def solve(self) -> tuple[dict[str, float], dict[str, float | None], np.ndarray, np.ndarray]:
        """Problem.solve; a coefficient the runs do not identify (standard error above its value: the prefill's
        attention term when every prompt is a few tokens) keeps the base value, said so, and the rest is refitted."""
        out = super().solve()
        p, se = out[0], out[1]
        weak = [n for n in self.names if se.get(n) is not None and se[n] > p[n]]
        if weak and len(weak) < len(self.names):
            for n in weak:
                base = self._base(n)
                if se[n] < base:  # near zero, and the base value is ruled out: the runs bound it, the fit's value holds
                    self._hold(n, p[n])
                    self.held[n] = (f"bounded by these runs (± {se[n]:.2g} on {p[n]:.2g} at a first fit; the base "
                                    f"{base:.2g} is ruled out): held at the first fit's value")
                else:
                    self.held[n] = (f"not identified by these runs (± {se[n]:.2g} on {p[n]:.2g} at a first fit): "
                                    f"kept")
            keep = [i for i, n in enumerate(self.names) if n not in weak]
            self.names, self.scale = [self.names[i] for i in keep], self.scale[keep]
            out = super().solve()
        robust = self.robust_stderr()  # the larger of the two: rows of a closed loop are not independent
        se = {n: max(v, robust[n]) if v is not None and robust[n] is not None else v for n, v in out[1].items()}
        return out[0], se, out[2], out[3]

    def _hold(self, name: str, value: float) -> None:
        """Hold a coefficient at `value` (the base profile the replay and the calibrated profile start from)."""
        role, k = name.split(".")
        field = "prefill_cost" if role == "prefill" else "decode_cost"
        self.base = self.base.model_copy(update={field: getattr(self.base, field).model_copy(update={k: value})})
        self._cache.clear()

    def per_run(self, r: np.ndarray, role: str) -> dict[str, dict[str, float]]:
        n_p, n_d = len(self.p_dt), len(self.g_obs)
        res, idx = {"prefill": (r[:n_p], self.p_run), "decode": (r[n_p:n_p + n_d], self.g_run),
                    "series": (r[:0], self.s_run)}[role]
        out = {}
        for i, run in enumerate(self.runs):
            m = idx == i
            if m.any():
                out[str(run.path)] = {"rms": float(np.sqrt(np.mean(res[m] ** 2))), "mean": float(np.mean(res[m])),
                                      "steps": int(m.sum())}
        return out
