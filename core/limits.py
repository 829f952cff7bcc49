"""A goal's latency limits as objects, and the one check of a run against a goal's SLO and contract.

The schema spells a limit `<metric>_<stat>_ms_lt` (`tpot_mean_ms_lt: 20`): the goal is validated once
(state/goal.py `Constraints.limits`) into `Limit(metric, stat, limit_ms)` rows, and nothing reads a limit's name
back into its parts: a name is looked up in `LIMIT_PARTS`, a table built from the parts. `violations` is the one
check of a run against a goal's limits and contract; the records' SLO lines and the twin's "breaks the contract"
are its words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.errors import FieldError
from core.summary import Summary

Metric = Literal["ttft", "tpot", "itl", "e2e"]
Stat = Literal["mean", "p50", "p90", "p99"]
LATENCIES: tuple[Metric, ...] = ("ttft", "tpot", "itl", "e2e")  # the schema's order (TTFT first)
STATS: tuple[Stat, ...] = ("mean", "p50", "p90", "p99")
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
DECODE_SIDE = ("tpot", "itl", "e2e")  # the latencies a decode step's time moves (E2E is mostly decode)
PREFILL_SIDE = ("ttft", "e2e")  # the latencies prefill queueing and prefill time move


def limit_key(metric: str, stat: str) -> str:
    """The schema's name of a limit on `metric` at `stat`: `tpot_mean_ms_lt`."""
    return f"{metric}_{stat}_ms_lt"


def figure_key(metric: str, stat: str) -> str:
    """The summaries' and predictions' name of a latency figure: `ttft_p99_ms`."""
    return f"{metric}_{stat}_ms"


LIMIT_PARTS: dict[str, tuple[Metric, Stat]] = {limit_key(m, s): (m, s) for m in LATENCIES for s in STATS}


def latency(s: Summary | None, metric: str, stat: str) -> float | None:
    """A latency figure of a run in ms (None: no run, or unmeasured)."""
    if s is None:
        return None
    got = getattr(getattr(s, f"{metric}_ms", None), stat, None)
    return None if got is None else float(got)


@dataclass(frozen=True)
class Limit:
    """One latency limit: the summary's <metric> at <stat> must stay strictly under `limit_ms`."""

    metric: Metric
    stat: Stat
    limit_ms: float

    @property
    def key(self) -> str:
        """The schema's name, as violations, ledgers and diagnoses name the limit (`tpot_mean_ms_lt`)."""
        return limit_key(self.metric, self.stat)

    @property
    def figure_key(self) -> str:
        """The figure's name in summaries and predictions (`ttft_p99_ms`)."""
        return figure_key(self.metric, self.stat)

    @property
    def words(self) -> str:
        return f"mean {NAMES[self.metric]}" if self.stat == "mean" else f"{NAMES[self.metric]} {self.stat}"

    @property
    def decode_side(self) -> bool:
        return self.metric in DECODE_SIDE

    @property
    def prefill_side(self) -> bool:
        return self.metric in PREFILL_SIDE

    @property
    def side(self) -> Literal["decode", "prefill", "both"]:
        """Which side's knobs move this figure: the decode batch (TPOT, ITL), prefill queueing (TTFT), or both (E2E)."""
        return "both" if self.decode_side and self.prefill_side else "decode" if self.decode_side else "prefill"

    def figure(self, s: Summary | None) -> float | None:
        """The figure this limit is on, in ms (None: unmeasured)."""
        return latency(s, self.metric, self.stat)

    def slack(self, s: Summary | None) -> float | None:
        """1 − figure / limit: the share of the limit left (negative: broken); None unmeasured."""
        got = self.figure(s)
        return None if got is None else 1.0 - got / self.limit_ms

    def kept(self, value: float | None) -> bool:
        return value is not None and value < self.limit_ms


def limit_of(key: str, limit_ms: float) -> Limit:
    """A schema name (`<metric>_<stat>_ms_lt`) and its value as a Limit; FieldError for a name the schema lacks."""
    parts = LIMIT_PARTS.get(key)
    if parts is None:
        raise FieldError(key, f"not a latency limit; one of {list(LIMIT_PARTS)}")
    return Limit(*parts, limit_ms=float(limit_ms))


def figure_of(s: Summary | None, key: str) -> float | None:
    """The figure a limit's name is on, read off a Summary (a ledger keeps the name of the limit it predicted)."""
    return latency(s, *LIMIT_PARTS[key])


def binding(limits: tuple[Limit, ...], s: Summary | None) -> Limit | None:
    """The limit with the least relative slack at this run (an unmeasured figure counts as no slack used);
    without a run, the first by key."""
    if not limits:
        return None
    if s is None:
        return limits[0]
    return min(limits, key=lambda lim: (1.0 if lim.slack(s) is None else lim.slack(s), lim.key))  # type: ignore


def tightest(limits: tuple[Limit, ...]) -> dict[str, float]:
    """Per-request SLOs for goodput (core.metrics.summarize): each latency's tightest limit (`ttft_ms`, `tpot_ms` ...),
    in the order of `limits`."""
    out: dict[str, float] = {}
    for lim in limits:
        name = f"{lim.metric}_ms"
        out[name] = min(lim.limit_ms, out.get(name, lim.limit_ms))
    return out


@dataclass(frozen=True)
class Violation:
    """One thing a run breaks of its goal: `field`, the goal's field (a limit's key, `all_succeed`, `output_len`,
    `cards`, `min_cache_hit`), and `words`; a record's line is "field: words"."""

    field: str
    words: str
    limit: Limit | None = None  # the latency limit broken (None: the contract)

    def __str__(self) -> str:
        return f"{self.field}: {self.words}"


@dataclass(frozen=True)
class Terms:
    """What a valid run of a goal must keep: its latency limits and its contract's figures."""

    limits: tuple[Limit, ...]
    all_succeed: bool = True
    output_len: int | None = None
    cards: int | None = None
    min_cache_hit: float | None = None

    def violations(self, s: Summary) -> tuple[Violation, ...]:
        """Everything the run breaks: each limit unmeasured or not strictly under (in the schema's order), then the
        contract (a failed request, an output of another length, fewer cards, too little cache hit)."""
        out: list[Violation] = []
        for lim in sorted(self.limits, key=lambda x: (LATENCIES.index(x.metric), STATS.index(x.stat))):
            got = lim.figure(s)
            if got is None:
                out.append(Violation(lim.key, f"no {lim.metric} {lim.stat} measured", lim))
            elif not got < lim.limit_ms:
                words = f"{lim.metric} {lim.stat} {got:.3f} ms is not below {lim.limit_ms:g} ms"
                out.append(Violation(lim.key, words, lim))
        if self.all_succeed and s.n_failed:
            out.append(Violation("all_succeed", f"{s.n_failed} requests failed"))
        if self.output_len is not None and (s.output_len_min, s.output_len_max) != (self.output_len,) * 2:
            words = f"outputs {s.output_len_min}..{s.output_len_max}, not all {self.output_len}"
            out.append(Violation("output_len", words))
        if self.cards is not None and s.cards < self.cards:
            out.append(Violation("cards", f"{s.cards} card(s) in use, the goal requires {self.cards}"))
        if self.min_cache_hit is not None and (s.cache_hit is None or s.cache_hit < self.min_cache_hit):
            out.append(Violation("min_cache_hit", f"cache hit {s.cache_hit} below {self.min_cache_hit}"))
        return tuple(out)

    def contract_breaks(self, s: Summary) -> tuple[Violation, ...]:
        """What the run breaks of the contract alone (the latency limits aside)."""
        return tuple(v for v in self.violations(s) if v.limit is None)
