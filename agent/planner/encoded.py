"""The goal's discrete space encoded for Optuna (value indices) and for a kernel model (0..1 per knob), and a TPE
study told the stations measured or predicted so far: the one encoding of the explorer (proposers/explorer.py) and of
the twin's model-based search (twin_space.py)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import optuna

from core.canonical import canon
from core.knobs import catalog


class Space:
    """The goal's discrete space encoded for Optuna (value indices) and for the kernel model (0..1 per knob)."""

    def __init__(self, space: dict[str, tuple[Any, ...] | list[Any]]):
        self.values = {k: list(v) for k, v in space.items() if v}
        cat = catalog()
        self.ordered = {k: all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vs)
                        and (k not in cat or cat.get(k).type not in ("enum", "bool")) for k, vs in self.values.items()}
        for k, ordered in self.ordered.items():
            if ordered:
                self.values[k] = sorted(self.values[k])

    def index(self, knob: str, value: Any) -> int | None:
        vs = self.values[knob]
        for i, v in enumerate(vs):
            if canon(v) == canon(value):
                return i
        if self.ordered[knob] and isinstance(value, (int, float)) and not isinstance(value, bool):
            return min(range(len(vs)), key=lambda i: abs(vs[i] - value))  # off the grid: its nearest value
        return None

    def encode(self, knobs: dict[str, Any]) -> dict[str, int] | None:
        out = {}
        for k in self.values:
            i = self.index(k, knobs.get(k, catalog().get(k).default if k in catalog() else None))
            if i is None:
                return None
            out[k] = i
        return out

    def vector(self, idx: dict[str, int]) -> np.ndarray:
        return np.array([idx[k] / max(1, len(self.values[k]) - 1) if self.ordered[k] else float(idx[k])
                         for k in self.values])

    def distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = np.abs(a - b)
        cats = np.array([not self.ordered[k] for k in self.values])
        if cats.any():
            d[..., cats] = (d[..., cats] > 0).astype(float)
        return np.sqrt((d ** 2).sum(axis=-1))

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {k: (optuna.distributions.IntDistribution(0, len(vs) - 1) if self.ordered[k]
                    else optuna.distributions.CategoricalDistribution(list(range(len(vs)))))
                for k, vs in self.values.items()}


def study(space: Space, obs: list[tuple[dict[str, int], float, float]], seed: int) -> optuna.Study:
    """A seeded multivariate TPE study (maximise), told every (encoded station, objective, latency excess) so far;
    a station with an excess above 0 is infeasible to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=2)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = space.distributions()
    for idx, y, viol in obs:
        study.add_trial(optuna.trial.create_trial(params=dict(idx), distributions=dists, value=y,
                                                  constraints={"latency_excess": viol}))
    return study
