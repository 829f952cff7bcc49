"""What the runs' evidence says beyond the step times (simulator.calibrate fits it before the step costs): the MTP
acceptance per draft position and the MoE expert-load spread.

Each run's evidence is the executor's digest of it (executor/evidence.py, `evidence.json` beside the run's records;
read here from the records as the digest reads them, core.evidence_decode, when a run directory has none):

* acceptance: `spec_accept_per_position` is the share of drafts whose position i was accepted, a survival
  S_i = Π_{j<=i} α·decay^(j-1) under the profile's shape (conditional acceptance of position i is α·decay^(i-1),
  simulator/decode.py), so log S_i = i·log α_task + i(i-1)/2·log decay is linear: one α per task type the runs'
  scenarios have, one decay over all runs, by least squares. The decay is fitted only where some run observed two
  or more positions (one position cannot tell α from the decay), within (0, 1]; α within [0, ALPHA_MAX]. A task
  type no speculative run had keeps the prior's α, and the prior's decay is kept without two positions: said so.
* expert-load spread: `expert_load_spread` is the worst instance's max/mean routed load over the EP ranks over the
  whole run, the layout's persistent skew (the per-step routing spread averages out over a run; the simulator's
  record is exactly `decode_cost.if_static[layout]`, simulator/experts.py), so the layout's skew is the mean of its
  runs' spreads. A layout no run used (or a run without an expert-load record) keeps the prior's, said so; a dense
  profile (ep 1) has no imbalance term and nothing is fitted.

The step-cost fit then reads the fitted imbalance (simulator.calibrate_problem: IF at each step's batch), so a
truth more skewed than the prior no longer pushes its excess into decode a, b, c.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core import records as rec
from core import scenarios as sc
from core.evidence import Evidence
from core.evidence_decode import expert_load, expert_load_spread, spec_accept_per_position
from core.profiles import Profile
from core.records import EngineSample

EVIDENCE = "evidence.json"  # the executor's digest beside a run's records (executor/collect.py)
ALPHA_MAX = 0.989  # acceptance must stay below 1 (core.profiles); as simulator.perturb clips it
SPEC_KEPT = "kept: no run with speculative decoding"


@dataclass
class EvidenceFit:
    """The fitted acceptance and imbalance, the rows of the coefficient table, and their provenance."""

    acceptance: dict[str, float] = field(default_factory=dict)  # task -> α (the fitted tasks only)
    decay: float | None = None  # None: kept
    if_static: dict[str, float] = field(default_factory=dict)  # layout -> max/mean (the fitted layouts only)
    rows: list[tuple[str, float, float | None, str]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def apply(self, prof: Profile) -> Profile:
        """The profile with what the evidence fitted (validated afresh)."""
        dc = prof.decode_cost.model_copy(update={"if_static": prof.decode_cost.if_static | self.if_static})
        data = prof.model_dump() | {"acceptance": prof.acceptance | self.acceptance, "decode_cost": dc.model_dump()}
        if self.decay is not None:
            data["acceptance_decay"] = self.decay
        return Profile.model_validate(data)


def run_evidence(path: Any, info: Any) -> Evidence | None:
    """A run's evidence: the executor's digest beside its records, else the two figures this fit reads, computed from
    the records as the digest computes them (core.evidence_decode); None when neither can be read."""
    f = path / EVIDENCE
    if f.exists():
        try:
            ev = Evidence.model_validate(json.loads(f.read_text()))
            if ev.error is None:
                return ev
        except (OSError, ValueError):
            pass
    try:  # a bare run directory (`tuneloop load`, the simulator's own): the engine's samples and its expert load
        samples = list(rec.read_jsonl(path / rec.METRICS, EngineSample)) if (path / rec.METRICS).exists() else []
        el = path / rec.EXPERT_LOAD
        load = expert_load(json.loads(el.read_text())) if el.exists() else None
    except (OSError, ValueError):  # an unreadable record: the evidence is advisory, the prior's values are kept
        return None
    return Evidence(spec_accept_per_position=spec_accept_per_position(samples),
                    expert_load_spread=expert_load_spread(load))


def task_of(info: Any) -> str | None:
    """The task type of a run's scenario (what sets its acceptance), or None when the scenario is not installed."""
    try:
        return str(sc.load(info.scenario).task)
    except (ValueError, OSError):  # an unknown scenario (DataFileError, FileNotFoundError): not attributable
        return None


def fit_acceptance(obs: list[tuple[str, int, float]], base: Profile) -> EvidenceFit:
    """α per task and the decay from (task, position i >= 1, survival S_i) observations: least squares on logs."""
    out = EvidenceFit()
    obs = [(t, i, s) for t, i, s in obs if s > 0]
    tasks = sorted({t for t, _, _ in obs})
    decay_free = any(i >= 2 for _, i, _ in obs)
    if tasks:
        cols = len(tasks) + decay_free
        x, y = np.zeros((len(obs), cols)), np.zeros(len(obs))
        fixed_v = math.log(base.acceptance_decay)
        for r, (t, i, s) in enumerate(obs):
            x[r, tasks.index(t)] = i
            y[r] = math.log(s)
            if decay_free:
                x[r, -1] = i * (i - 1) / 2
            else:
                y[r] -= i * (i - 1) / 2 * fixed_v
        sol = np.linalg.lstsq(x, y, rcond=None)[0]
        if decay_free and sol[-1] > 0:  # a decay above 1 is outside the shape: held at 1, α fitted again
            x, decay_free = x[:, :-1], False
            sol = np.linalg.lstsq(x, y, rcond=None)[0]
            out.decay = 1.0
        resid = y - x @ sol
        dof = len(y) - x.shape[1]
        se: list[float | None] = [None] * x.shape[1]
        if dof > 0:
            try:
                cov = np.linalg.inv(x.T @ x) * float(resid @ resid) / dof
                se = [float(math.sqrt(max(v, 0.0))) for v in np.diag(cov)]
            except np.linalg.LinAlgError:
                pass
        for j, t in enumerate(tasks):
            a = min(max(math.exp(sol[j]), 0.0), ALPHA_MAX)
            out.acceptance[t] = a
            out.rows.append((f"acceptance.{t}", a, None if se[j] is None else a * se[j],
                             "fitted (spec_accept_per_position)"))
        if decay_free:
            d = min(math.exp(sol[-1]), 1.0)
            out.decay = d
            out.rows.append(("acceptance_decay", d, None if se[-1] is None else d * se[-1],
                             "fitted (spec_accept_per_position)"))
        elif out.decay is not None:
            out.rows.append(("acceptance_decay", 1.0, None, "fitted at its bound 1.0 (the shares fall no faster "
                                                            "than α per position)"))
    for t in sorted(set(base.acceptance) - set(tasks)):
        why = f"{SPEC_KEPT} on a {t} scenario" if tasks else f"{SPEC_KEPT} (no acceptance per position observed)"
        out.rows.append((f"acceptance.{t}", base.acceptance[t], None, why))
    if out.decay is None:
        why = (f"{SPEC_KEPT} (no acceptance per position observed)" if not tasks else
               "kept: one draft position observed (α and the decay cannot be separated)")
        out.rows.append(("acceptance_decay", base.acceptance_decay, None, why))
    out.info = {"observations": len(obs), "tasks": tasks}
    return out


def fit_imbalance(obs: list[tuple[str, float]], base: Profile) -> EvidenceFit:
    """The persistent max/mean EP-rank load per expert layout from (layout, run's spread) observations."""
    out = EvidenceFit()
    dc = base.decode_cost
    if dc.ep <= 1:  # a dense model: no imbalance term
        return out
    by: dict[str, list[float]] = {}
    for layout, v in obs:
        by.setdefault(layout, []).append(min(max(float(v), 1.0), dc.ep * 0.999))  # simulator.experts' clip
    for layout in sorted(set(dc.if_static) | set(by)):
        got = by.get(layout)
        if got:
            m = float(np.mean(got))
            se = float(np.std(got, ddof=1) / math.sqrt(len(got))) if len(got) > 1 else None
            out.if_static[layout] = m
            out.rows.append((f"decode.if_static.{layout}", m, se,
                             f"fitted (expert_load_spread, {len(got)} run(s))"))
        else:
            why = "no expert-load record in the runs" if not obs else "no run with this expert_layout"
            out.rows.append((f"decode.if_static.{layout}", dc.skew(layout), None, f"kept: {why}"))
    return out


def fit_evidence(runs: list[Any], base: Profile) -> EvidenceFit:
    """Acceptance and imbalance from the runs (simulator.calibrate_problem.Run) against the base profile."""
    acc: list[tuple[str, int, float]] = []
    imb: list[tuple[str, float]] = []
    skipped: list[str] = []
    for r in runs:
        speculated = r.k > 0
        moe = base.decode_cost.ep > 1
        if not (speculated or moe):
            continue
        ev = run_evidence(r.path, r.info)
        if ev is None:
            skipped.append(str(r.path))
            continue
        if speculated and ev.spec_accept_per_position:
            task = task_of(r.info)
            if task is None:
                skipped.append(str(r.path))
            else:
                acc += [(task, i + 1, float(s)) for i, s in enumerate(ev.spec_accept_per_position[:r.k])]
        if moe and ev.expert_load_spread is not None:
            imb.append((str(r.knobs.get("expert_layout", "none")), float(ev.expert_load_spread)))
    a, i = fit_acceptance(acc, base), fit_imbalance(imb, base)
    return EvidenceFit(acceptance=a.acceptance, decay=a.decay, if_static=i.if_static, rows=a.rows + i.rows,
                       info={"acceptance": a.info, "imbalance_runs": len(imb), "unread": skipped})


def value_of(profile: Profile, name: str) -> float:
    """A coefficient-table name's value in a profile: `prefill.a`, `decode.b_draft`, `acceptance.chat`,
    `acceptance_decay`, `decode.if_static.none` (the layout's skew)."""
    parts = name.split(".")
    if parts[0] == "acceptance":
        return float(profile.acceptance[parts[1]])
    if parts[0] == "acceptance_decay":
        return float(profile.acceptance_decay)
    if parts[1:2] == ["if_static"]:
        return float(profile.decode_cost.skew(parts[2]))
    return float(getattr(profile.prefill_cost if parts[0] == "prefill" else profile.decode_cost, parts[1]))
