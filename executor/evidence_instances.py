"""Per-instance evidence: each engine instance's own figures, and how unevenly a role's instances carry the load.

A role's queue summed over its instances (executor/evidence.py) hides an instance that lags: on P8 + D8 one decode
instance whose batch is full while seven idle reads as a fine average. So every instance is digested apart (its
queue, batch, batch fill, KV use, requests served and KV hand-off, as counter deltas over its own scrapes) and a role
with two or more instances gets its spread per figure: max over mean and the instances at both ends. A spread in
requests served is the router's balance; in KV use or queue, an instance that falls behind.
"""
from __future__ import annotations

from typing import Any, Sequence

from core.evidence_parts import InstanceFigures, Spread
from core.records import EngineSample
from executor.engines import metric_names
from executor.evidence_kv import FAILURES
from executor.promseries import series_spec

RUNNING = metric_names("running")
WAITING = metric_names("waiting")
WAITING_DECODE = metric_names("waiting_capacity") + WAITING
KV_USAGE = metric_names("kv_usage")
REQUESTS = metric_names("requests")
# the figures whose spread over a role's instances is evidence (counters as deltas, gauges as means or maxima)
SPREAD = ("requests", "running_mean", "waiting_mean", "batch_fill", "kv_usage_max", "kv_tokens_remote",
          "kv_transfers")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


GAUGES = {"running": (RUNNING, sum), "engine_running": (RUNNING, max), "kv": (KV_USAGE, max)}
COUNTERS = ("requests", "kv_tokens_remote", "kv_transfers", "kv_bytes", *FAILURES)


def index_series(values: dict[str, float]) -> dict[str, list[tuple[str, float]]]:
    """A sample's series by metric name, so each figure reads only its own metric's series."""
    out: dict[str, list[tuple[str, float]]] = {}
    for k, v in values.items():
        out.setdefault(k.split("{", 1)[0], []).append((k, v))
    return out


def _pick(index: dict[str, list[tuple[str, float]]], names: tuple[str, ...], reduce: Any) -> float | None:
    """As executor.promseries.first_value, over an indexed sample."""
    for name in names:
        base, want = series_spec(name)
        found = [v for k, v in index.get(base, ()) if not want or want.items() <= series_spec(k)[1].items()]
        if found:
            return float(reduce(found))
    return None


def _delta(rows: list[tuple[float, dict[str, float | None]]], key: str, since: float | None) -> float | None:
    """last - first of one counter over the instance's scrapes (from its last scrape at or before `since`)."""
    seen = [(t, v[key]) for t, v in rows if v[key] is not None]
    if not seen:
        return None
    base = [v for t, v in seen if since is not None and t <= since]
    return max(seen[-1][1] - (base[-1] if base else seen[0][1]), 0.0)


def _one(ss: Sequence[EngineSample], role: str, limit: float | None, since: float | None) -> InstanceFigures:
    """One instance's figures over its own scrapes (None where it exported nothing)."""
    waiting_names = WAITING_DECODE if role == "decode" else WAITING
    rows = []
    for s in ss:
        ix = index_series(s.values)
        got: dict[str, float | None] = {k: _pick(ix, names, red) for k, (names, red) in GAUGES.items()}
        got["waiting"] = _pick(ix, waiting_names, sum)
        got |= {k: _pick(ix, metric_names(k), sum) for k in COUNTERS}
        rows.append((s.t, got))

    def col(key: str) -> list[float]:
        return [v[key] for _, v in rows if v[key] is not None]

    running, fill, kv = col("running"), _mean(col("engine_running")), col("kv")
    failed = [d for k in FAILURES if (d := _delta(rows, k, since)) is not None]
    return InstanceFigures(
        role=role,
        scrapes=len(ss),
        requests=_delta(rows, "requests", None),
        running_mean=_mean(running),
        running_max=max(running) if running else None,
        waiting_mean=_mean(col("waiting")),
        # the batch against its limit (per engine): decode's fill; a prefill instance runs one-token requests
        batch_fill=fill / limit if fill is not None and limit and role != "prefill" else None,
        kv_usage_max=max(kv) if kv else None,
        kv_tokens_remote=_delta(rows, "kv_tokens_remote", None),
        kv_transfers=_delta(rows, "kv_transfers", None),
        kv_bytes=_delta(rows, "kv_bytes", None),
        kv_failed=float(sum(failed)) if failed else None,
    )


def per_instance(samples: Sequence[EngineSample], batch_limit: float | None,
                 since: float | None = None) -> dict[str, InstanceFigures] | None:
    """{instance: its figures} for every instance scraped, or None without samples. `since`: the first measured
    send, from which an instance's hand-off failures count (as in executor/evidence_kv.py)."""
    groups: dict[str, list[EngineSample]] = {}
    for s in sorted(samples, key=lambda s: s.t):
        groups.setdefault(s.instance, []).append(s)
    if not groups:
        return None
    return {inst: _one(ss, ss[0].role, batch_limit, since) for inst, ss in sorted(groups.items())}


def spread(instances: dict[str, InstanceFigures] | None) -> dict[str, dict[str, Spread]] | None:
    """{role: {figure: Spread}} for each role with two or more instances reporting the figure (a mean of 0 has no
    spread); None when no role has one."""
    out: dict[str, dict[str, Spread]] = {}
    for role in sorted({f.role for f in (instances or {}).values()}):
        mine = {i: f for i, f in (instances or {}).items() if f.role == role}
        for fig in SPREAD:
            got = {i: v for i, f in mine.items() if (v := f.figure(fig)) is not None}
            mean = _mean(list(got.values()))
            if len(got) < 2 or not mean:
                continue
            hi = max(got, key=got.__getitem__)
            lo = min((i for i in got if i != hi), key=got.__getitem__)  # on a tie, another instance than the max
            out.setdefault(role, {})[fig] = Spread(max_over_mean=got[hi] / mean, max=hi, min=lo)
    return out or None
