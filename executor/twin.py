"""The goal's deployment twin: a simulator profile calibrated to the goal's own valid runs, fitted from a prior.

The prior is a profile of the same structure (roles, instance counts, cards, engine kind): the target's
`calibrated_profile` where it has one, else the profile a simulated goal names (`sim_profile`, as a user starts
from a similar deployment's profile); the fit and the predictions go through the executor's door into the
simulator (executor/transports/sim.py). Never a simulated target's hidden truth (`Target.truth_profile`): the
twin learns the deployment only from its runs. The fit is `simulator.calibrate.calibrate` over the runs' own
records and evidence (step costs with their standard errors, prompt tokenisation, MTP acceptance per task and its
decay per draft position, each expert layout's imbalance): what the runs say wins over the prior, and a coefficient
the runs cannot separate or did not observe keeps the prior's value and says so.

The fit on no run is the prior itself (it predicts the goal's first run out of sample). Fits are kept per set of runs (the planner asks for the twin fitted on every prefix of the goal's runs to
measure its out-of-sample error, agent/planner/twin.py); a station's prediction is kept per fit.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import profiles
from core.profiles import Profile
from executor.transports.sim import calibrate_runs, simulate_station

FITS_KEPT = 64  # fits kept per executor (each a profile and a few hundred floats): a long goal refits every run


@dataclass
class Twin:
    """One fit: the calibrated profile, the runs it came from, and its coefficient table."""

    profile: Profile
    prior: str
    runs: tuple[str, ...]
    table: list[tuple[str, float, float | None, str]]
    _cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def predict(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                slos: dict[str, float] | None = None, native: tuple[int, float] | None = None) -> dict[str, Any]:
        """The twin's prediction of one station: `summary`, the whole Summary of its simulated run, made by the code
        that summarises a measured run (core.metrics.summarize) with the goal's SLOs (`slos`: goodput) and native
        window rule (`native`: its least requests and seconds), so every objective and every limit the goal may
        name is predicted at its own window and statistic; beside it the whole window's output tok/s (and per card),
        mean TPOT and TTFT, the cards in use and the knobs the simulator does not model."""
        key = (f"{scenario}|{sorted((k, repr(v)) for k, v in knobs.items())}|{n}|{warmup}|{seed}|"
               f"{sorted((slos or {}).items())}|{native}")
        with self._lock:
            got = self._cache.get(key)
        if got is None:
            rule = {} if native is None else {"native_min_requests": native[0], "native_min_seconds": native[1]}
            s, left = simulate_station(self.profile, scenario, knobs, n, warmup=warmup, seed=seed, slos=slos, **rule)
            got = {"profile": self.profile.name, "summary": s, "cards": s.cards, "knobs_not_modelled": left,
                   "output_tok_s": s.whole.output_tok_s if s.whole else None,
                   "output_tok_s_per_card": s.whole.output_tok_s_per_card if s.whole else None,
                   "tpot_mean_ms": s.tpot_ms.mean, "ttft_mean_ms": s.ttft_ms.mean}
            with self._lock:
                self._cache[key] = got
        return got

    def coefficients(self) -> dict[str, tuple[float, float | None, str]]:
        """name -> (value, standard error, how it was fitted or why it was kept)."""
        return {name: (v, se, note) for name, v, se, note in self.table}


class Twins:
    """The fits of one executor, by (prior, runs); thread-safe (the service plans goals in threads)."""

    def __init__(self, runs_root: Path):
        self.root = Path(runs_root)
        self._fits: dict[tuple[str, tuple[str, ...]], Twin | str] = {}
        self._lock = threading.Lock()

    def fit(self, prior: str, run_ids: tuple[str, ...]) -> Twin | str:
        """The twin fitted on these runs from this prior; a str says why it could not be fitted."""
        key = (prior, tuple(run_ids))
        with self._lock:
            got = self._fits.get(key)
        if got is not None:
            return got
        got = self._fit(prior, run_ids)
        with self._lock:
            if len(self._fits) >= FITS_KEPT:
                self._fits.pop(next(iter(self._fits)))
            self._fits[key] = got
        return got

    def _fit(self, prior: str, run_ids: tuple[str, ...]) -> Twin | str:
        try:
            base = profiles.load(prior)
        except Exception as e:  # a prior that cannot be read: no twin, said once per fit
            return f"prior profile {prior!r} cannot be read: {e}"
        if not run_ids:  # the prior itself, before any run: what predicts the first run out of sample
            return Twin(profile=base, prior=prior, runs=(), table=[])
        dirs = [self.root / r for r in run_ids]
        missing = [r for r, d in zip(run_ids, dirs) if not d.is_dir()]
        if missing:
            return f"run directories not under {self.root}: {', '.join(missing)}"
        try:
            prof, table = calibrate_runs(dirs, prior, name=f"{base.name.removesuffix('-calibrated')}-twin")
        except Exception as e:  # runs the fit cannot use, or a solver failure: no twin this step, the rules lead
            return f"the fit failed: {type(e).__name__}: {e}"
        return Twin(profile=prof, prior=prior, runs=tuple(run_ids), table=table)


def prior_of(target: Any, sim_profile: str | None) -> str | None:
    """The twin's prior for a goal on this target: its calibrated profile, else the simulated goal's profile (a
    simulated target's own `profile` when the goal names none). None: nothing to start from (a real target
    without a calibrated profile)."""
    if target is None:
        return None
    cal = getattr(target, "calibrated_profile", None)
    if cal:
        return str(cal)
    if getattr(target, "kind", None) == "sim":
        return sim_profile or getattr(target, "profile", None)
    return None
