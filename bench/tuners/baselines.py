"""What users pick instead of tuneloop: an auto_tune-style grid, random search, Optuna TPE with constraints.

Every baseline runs stations through a `Meter`, so each is charged exactly as the executor charges
(restart, weight load, warm-up, relayout, load) and judged by the same verdicts and constraints.

* grid — vLLM's benchmarks/auto_tune: for every combination of server knobs (one restart each) start at
  the heaviest load and lower the request rate (then the concurrency) until the run meets the limits;
  the first run that does is that combination's figure.
* random — the space's points in a seeded random order, without replacement.
* tpe — Optuna's TPESampler over the same discrete values (categorical), with `constraints_func`
  returning the SLO/validity violation (> 0 = infeasible), as in SCOOT-style constrained BO. A point
  TPE suggests again is answered from its earlier result: no run, no charge, not an experiment.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Any

from bench.tuners.evaluate import Eval
from bench.tuners.meter import Meter
from core.station import LOAD_KNOBS


def points(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(space, combo)) for combo in itertools.product(*space.values())]


def _num(v: Any) -> float:
    return math.inf if v is None else float(v)


def grid(meter: Meter, space: dict[str, list[Any]], trials: int | None = None, order_seed: int | None = None) -> None:
    """auto_tune: restart per server combination, then walk the load down until the limits hold. `order_seed`
    shuffles the server combinations (None: the order the space lists them, as auto_tune does)."""
    server = {k: v for k, v in space.items() if k not in LOAD_KNOBS}
    load = {k: v for k, v in space.items() if k in LOAD_KNOBS}
    load_pts = points(load) if load else [{}]
    load_pts.sort(key=lambda p: (-_num(p.get("concurrency", 0)), -_num(p.get("request_rate", 0))))
    servers = points(server) if server else [{}]
    if order_seed is not None:
        random.Random(order_seed).shuffle(servers)
    for srv in servers:
        for lp in load_pts:
            if trials is not None and len(meter.trials) >= trials:
                return
            if meter.run(srv | lp).feasible:
                break


def random_search(meter: Meter, space: dict[str, list[Any]], seed: int, trials: int) -> None:
    pts = points(space)
    random.Random(seed).shuffle(pts)
    for p in pts[:trials]:
        meter.run(p)


def violation(ev: Eval, goal: Any) -> float:
    """How far a run is from feasible (0 = feasible): invalid or no figure 1.0, else relative latency excess."""
    if not ev.valid or ev.objective is None:
        return 1.0
    if not ev.violations:
        return 0.0
    limit = goal.constraints.tpot_mean_ms_lt
    if limit and ev.tpot_mean_ms is not None and ev.tpot_mean_ms >= limit:
        return max(ev.tpot_mean_ms / limit - 1.0, 1e-6)
    return 1.0


def _enc(v: Any) -> Any:
    return "inf" if isinstance(v, float) and math.isinf(v) else v


def tpe(meter: Meter, space: dict[str, list[Any]], seed: int, trials: int, goal: Any) -> int:
    """Optuna TPE with constraints; returns how many duplicate suggestions were answered from memory."""
    import warnings

    import optuna

    # constraints_func is what SCOOT-style setups use; Optuna 5 deprecates it in favour of set_constraint
    warnings.filterwarnings("ignore", message=".*constraints_func.*", category=FutureWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, constraints_func=lambda t: (t.user_attrs["violation"],))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    decode = {k: {_enc(v): v for v in vals} for k, vals in space.items()}
    seen: dict[tuple, tuple[float, float]] = {}
    total = len(points(space))
    dups = 0
    for _ in range(trials * 4):
        if len(meter.trials) >= trials or len(seen) >= total:
            break
        t = study.ask()
        p = {k: decode[k][t.suggest_categorical(k, list(decode[k]))] for k in space}
        key = tuple(repr(p[k]) for k in space)
        if key in seen:
            dups += 1
        else:
            ev = meter.run(p)
            seen[key] = (ev.objective if ev.valid and ev.objective is not None else 0.0, violation(ev, goal))
        value, viol = seen[key]
        t.set_user_attr("violation", viol)
        study.tell(t, value)
    return dups
