"""A seeded perturbation of a profile's truth: the deployment a tuner meets is not the one its prior describes.

`perturb(profile, seed)` returns a Profile whose step costs, MTP acceptance and MoE expert imbalance are moved
away from the library's figures by seeded factors, so a benchmark run on it (`bench/tuner_efficiency.py
--perturb-truth SEED`) cannot be won by a planner that has the library's coefficients built in:

* every step-cost coefficient of prefill and decode (a, b, c, sched_s; decode also a_draft, b_draft) times its own
  factor, log-uniform in [COST_LO, COST_HI] = [0.6, 1.6];
* MTP acceptance per task: α × a factor uniform in [ACC_LO, ACC_HI] = [0.8, 1.1], clipped into [0, ALPHA_MAX];
  acceptance_decay is kept;
* MoE expert imbalance (decode_cost.if_static, the max/mean EP-rank load per expert layout): the excess over a
  flat 1.0 times a factor log-uniform in [COST_LO, COST_HI] per layout (a flat layout stays flat; a dense
  profile, ep 1, has no imbalance term and keeps its map).

Layout, engine defaults, memory, transfer, fixed costs (restart, weight load, ...) and quality are kept: the
search space and what a change costs are the same; what a station measures is not. A draw depends on the seed,
the profile's name and the coefficient's name only, so the same seed gives the same truth for every case on a
profile, and the factors are recorded in the result's `calibration` (key `perturbed`) for a fitted-vs-true check.
"""
from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path
from typing import Any

import yaml

from core.profiles import Profile

COST_LO, COST_HI = 0.6, 1.6
ACC_LO, ACC_HI = 0.8, 1.1
ALPHA_MAX = 0.989  # acceptance must stay below 1 (core.profiles); 0.99 excluded
PREFILL_KEYS = ("a", "b", "c", "sched_s")
DECODE_KEYS = ("a", "b", "c", "a_draft", "b_draft", "sched_s")


def _rng(seed: int, name: str, what: str) -> random.Random:
    """One generator per (seed, profile, coefficient): adding a coefficient later moves no other draw."""
    return random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{name}:{what}".encode()).digest()[:8], "big"))


def log_uniform(seed: int, name: str, what: str, lo: float = COST_LO, hi: float = COST_HI) -> float:
    return math.exp(_rng(seed, name, what).uniform(math.log(lo), math.log(hi)))


def truth_name(name: str, seed: int) -> str:
    return f"{name}-truth{seed}"


def perturb(profile: Profile, seed: int) -> Profile:
    """The profile's perturbed truth for `seed` (validated as a Profile); factors under calibration['perturbed']."""
    name = profile.name
    factors: dict[str, float] = {}

    def scaled(role: str, cost: Any, keys: tuple[str, ...]) -> dict[str, float]:
        out = {}
        for k in keys:
            f = log_uniform(seed, name, f"{role}.{k}")
            factors[f"{role}.{k}"] = round(f, 6)
            out[k] = getattr(cost, k) * f
        return out

    pc = profile.prefill_cost.model_copy(update=scaled("prefill", profile.prefill_cost, PREFILL_KEYS))
    dc_update: dict[str, Any] = scaled("decode", profile.decode_cost, DECODE_KEYS)
    if profile.decode_cost.ep > 1:
        skew = {}
        for layout, v in sorted(profile.decode_cost.if_static.items()):
            f = log_uniform(seed, name, f"decode.if_static.{layout}")
            factors[f"decode.if_static.{layout}"] = round(f, 6)
            skew[layout] = 1.0 + (v - 1.0) * f
        dc_update["if_static"] = skew
    dc = profile.decode_cost.model_copy(update=dc_update)
    acceptance = {}
    for task, alpha in sorted(profile.acceptance.items()):
        f = _rng(seed, name, f"acceptance.{task}").uniform(ACC_LO, ACC_HI)
        factors[f"acceptance.{task}"] = round(f, 6)
        acceptance[task] = min(max(alpha * f, 0.0), ALPHA_MAX)
    calibration = dict(profile.calibration or {}) | {
        "perturbed": {"base": name, "seed": seed, "factors": factors,
                      "rule": f"step costs x log-uniform [{COST_LO}, {COST_HI}]; acceptance x uniform "
                              f"[{ACC_LO}, {ACC_HI}] clipped to [0, {ALPHA_MAX}]; imbalance excess over 1.0 x "
                              f"log-uniform [{COST_LO}, {COST_HI}] (simulator.perturb)"}}
    data = profile.model_dump() | {
        "name": truth_name(name, seed),
        "description": f"{profile.description} [perturbed truth of {name}, seed {seed} (simulator.perturb)]".strip(),
        "prefill_cost": pc.model_dump(), "decode_cost": dc.model_dump(),
        "acceptance": acceptance, "calibration": calibration}
    return Profile.model_validate(data)  # validated afresh: a perturbation never yields an invalid profile


def factors_of(profile: Profile) -> dict[str, float]:
    """The factors a perturbed profile records (empty for an unperturbed one)."""
    return dict(((profile.calibration or {}).get("perturbed") or {}).get("factors") or {})


def write(profile: Profile, path: Any) -> str:
    """Write a (perturbed) profile as YAML that `core.profiles.load(path)` reads back equal; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(profile.model_dump(), sort_keys=False))
    return str(p)
