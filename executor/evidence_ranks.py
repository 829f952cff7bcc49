"""Per-rank evidence: each DP / EP rank of an instance digested apart, and each figure combined over the
instance's ranks.

An instance of several data-parallel ranks steps as one where its ranks meet (an EP group's all-to-all): the
slowest rank gates every step, and a role's figures summed over instances (executor/evidence.py) or one
instance's (executor/evidence_instances.py) hide it. A rank is what the engine labels one (vLLM's DP engine index
`engine`, SGLang's `dp_rank`, or `dp` on its per-DP gauges; SGLang reports from each attention-DP group's first
scheduler), or a rank endpoint the scraper was given apart (`decode-1.r3`: rank 3 of decode-1, its own /metrics).
Per rank: the running and waiting means, the KV use peak and the step time (the mean inter-token latency over the
load, where the engine exports it per rank). Per figure over an instance's ranks: the sum, the maximum, the median
and the rank at the maximum (for the step time, the slowest). Only instances with two or more ranks are kept; an
engine that labels no rank (the simulator) gives None.
"""
from __future__ import annotations

import re
from statistics import median
from typing import Sequence

from core.evidence_parts import RankFigures, RankGroup, RankSpread
from core.records import EngineSample
from executor.engines import metric_names
from executor.evidence_instances import index_series
from executor.promseries import series_spec

RANK_LABELS = ("engine", "dp_rank", "dp")
_ENDPOINT = re.compile(r"(?P<group>.+)\.(?:r(?P<rank>[0-9]+)|n[0-9]+)")
GAUGES = {"running": metric_names("running"), "kv": metric_names("kv_usage")}
WAITING = {"prefill": metric_names("waiting"), "decode": metric_names("waiting_capacity") + metric_names("waiting"),
           "mixed": metric_names("waiting")}
ITL = metric_names("itl")  # a histogram: mean step time per rank = increase of _sum over increase of _count


def group_of(instance: str) -> tuple[str, str | None]:
    """(the instance a scrape belongs to, its endpoint rank): `decode-1.r3` -> ("decode-1", "3"); a node endpoint of
    an instance spanning hosts, whose ranks its labels name: `decode-1.n2` -> ("decode-1", None)."""
    m = _ENDPOINT.fullmatch(instance)
    return (m["group"], m["rank"]) if m else (instance, None)


def _rank(endpoint: str | None, labels: dict[str, str]) -> str | None:
    """The rank one series belongs to: its endpoint's rank and its rank labels (None where it names neither)."""
    parts = ([f"r{endpoint}"] if endpoint is not None else []) + [f"{k}={labels[k]}" for k in RANK_LABELS
                                                                    if k in labels]
    return ",".join(parts) or None


def _per_rank(index: dict[str, list[tuple[str, float]]], names: tuple[str, ...], endpoint: str | None,
              suffix: str = "") -> dict[str | None, float]:
    """{rank: value} of the first metric name present (summed over a rank's other labels, e.g. a finish reason)."""
    for name in names:
        base, want = series_spec(name)
        out: dict[str | None, float] = {}
        for k, v in index.get(base + suffix, ()):
            labels = series_spec(k)[1]
            if want.items() <= labels.items():
                r = _rank(endpoint, labels)
                out[r] = out.get(r, 0.0) + v
        if out:
            return out
    return {}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def ranks(samples: Sequence[EngineSample]) -> dict[str, RankGroup] | None:
    """{instance: its ranks' figures and their combination} for every instance with two or more ranks, else None."""
    cols: dict[tuple[str, str], dict[str, list[float]]] = {}
    itl: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (sum, count) per scrape
    role_of: dict[str, str] = {}
    for s in sorted(samples, key=lambda s: s.t):
        group, endpoint = group_of(s.instance)
        role_of.setdefault(group, s.role)
        ix = index_series(s.values)
        figs = {k: _per_rank(ix, names, endpoint) for k, names in GAUGES.items()}
        figs["waiting"] = _per_rank(ix, WAITING.get(s.role, WAITING["mixed"]), endpoint)
        for fig, got in figs.items():
            for r, v in got.items():
                if r is not None:
                    cols.setdefault((group, r), {}).setdefault(fig, []).append(v)
        sums, counts = (_per_rank(ix, ITL, endpoint, suffix) for suffix in ("_sum", "_count"))
        for r in sums.keys() & counts.keys():
            if r is not None:
                itl.setdefault((group, r), []).append((sums[r], counts[r]))
    figures: dict[str, dict[str, RankFigures]] = {}
    for key in sorted(cols.keys() | itl.keys()):
        c, steps = cols.get(key, {}), itl.get(key, [])
        dsum, dcount = (steps[-1][0] - steps[0][0], steps[-1][1] - steps[0][1]) if len(steps) > 1 else (0.0, 0.0)
        if dcount <= 0 and steps:  # one scrape, or no step between the first and the last: the totals so far
            dsum, dcount = steps[-1]
        figures.setdefault(key[0], {})[key[1]] = RankFigures(
            running_mean=_mean(c.get("running", [])), waiting_mean=_mean(c.get("waiting", [])),
            kv_usage_max=max(c["kv"]) if c.get("kv") else None, step_s=dsum / dcount if dcount > 0 else None)
    out = {g: RankGroup(role=role_of[g], ranks=rs, combined=combined(rs)) for g, rs in figures.items() if len(rs) > 1}
    return out or None


def combined(rs: dict[str, RankFigures]) -> dict[str, RankSpread]:
    """Each figure over the ranks reporting it: sum, max, median and the rank at the max (the first on a tie)."""
    out: dict[str, RankSpread] = {}
    for fig in RankFigures.model_fields:
        got = {r: v for r, f in rs.items() if (v := getattr(f, fig)) is not None}
        if got:
            worst = max(got, key=got.__getitem__)
            out[fig] = RankSpread(sum=sum(got.values()), max=got[worst], median=median(got.values()), worst=worst,
                                  ranks=len(got))
    return out
