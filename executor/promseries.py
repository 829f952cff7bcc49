"""Prometheus series by name: a metric name with labels selects every series whose labels include them.

Scrapes are stored as {name{labels}: value} (executor.evidence.parse_prometheus); the evidence digests read
them through these helpers with the names each engine adapter maps to an evidence key.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series_spec(name: str) -> tuple[str, dict[str, str]]:
    """'metric{k="v"}' -> ('metric', {k: v}); a plain name has no labels."""
    base, _, rest = name.partition("{")
    return base, dict(_LABEL.findall(rest))


def hits(values: dict[str, float], name: str) -> list[float]:
    """Every series of a metric whose labels include the spec's labels (one per DP engine, say)."""
    base, want = series_spec(name)
    out = []
    for k, v in values.items():
        if k == base or k.startswith(base + "{"):
            if not want or want.items() <= series_spec(k)[1].items():
                out.append(v)
    return out


def first_value(values: dict[str, float], names: Iterable[str],
                reduce: Callable[[list[float]], float]) -> float | None:
    for name in names:
        found = hits(values, name)
        if found:
            return float(reduce(found))
    return None


def base_value(values: dict[str, float], names: Iterable[str]) -> float | None:
    """Sum of every series of the first metric name present (labels ignored unless the name gives some)."""
    return first_value(values, names, sum)


def max_value(values: dict[str, float], names: Iterable[str]) -> float | None:
    """Largest series of the first metric name present: a fraction or a per-engine limit over DP engines."""
    return first_value(values, names, max)
