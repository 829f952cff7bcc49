"""The goal as the planner reads it: the objective, the latency limits as typed rows, the contract.

A goal may limit any latency at any statistic (TTFT p99, mean TPOT, E2E p90 ...) and maximise any objective the
schema allows (output tok/s per card, output tok/s, qps, goodput). The planner never names a limit key: it asks
this view which limit binds at a run (the least relative slack), how much slack it leaves, which figure of a
Summary it is on, and which limit a decode-side knob moves (TPOT, ITL; E2E with either side) against a
prefill-side one (TTFT; E2E). The validated spec (state/goal.py GoalSpec) derives this view; it is pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Protocol, runtime_checkable

from core.summary import Summary

DECODE_SIDE = ("tpot", "itl", "e2e")  # the latencies a decode step's time moves (E2E is mostly decode)
PREFILL_SIDE = ("ttft", "e2e")  # the latencies prefill queueing and prefill time move
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
LIMIT_SUFFIX = "_ms_lt"  # how the schema spells a latency limit: <metric>_<stat>_ms_lt


@dataclass(frozen=True)
class Limit:
    """One latency limit: the summary's <metric> at <stat> must stay strictly under `limit_ms`."""

    key: str  # the schema's key, as violations and ledgers name it
    metric: Literal["ttft", "tpot", "itl", "e2e"]
    stat: Literal["mean", "p50", "p90", "p99"]
    limit_ms: float

    @property
    def figure_key(self) -> str:
        """The figure's name in summaries and predictions (`ttft_p99_ms`)."""
        return f"{self.metric}_{self.stat}_ms"

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
        if s is None:
            return None
        got = getattr(getattr(s, f"{self.metric}_ms", None), self.stat, None)
        return None if got is None else float(got)

    def slack(self, s: Summary | None) -> float | None:
        """1 − figure / limit: the share of the limit left (negative: broken); None unmeasured."""
        got = self.figure(s)
        return None if got is None else 1.0 - got / self.limit_ms

    def kept(self, value: float | None) -> bool:
        return value is not None and value < self.limit_ms


def binding(limits: tuple[Limit, ...], s: Summary | None) -> Limit | None:
    """The limit with the least relative slack at this run (an unmeasured figure counts as no slack used);
    without a run, the first by key."""
    if not limits:
        return None
    if s is None:
        return limits[0]
    return min(limits, key=lambda lim: (1.0 if lim.slack(s) is None else lim.slack(s), lim.key))  # type: ignore


def limit_of(key: str, limit_ms: float) -> Limit:
    """A schema key (`<metric>_<stat>_ms_lt`) and its value as a Limit."""
    metric, stat = key.removesuffix(LIMIT_SUFFIX).split("_")
    return Limit(key=key, metric=metric, stat=stat, limit_ms=float(limit_ms))  # type: ignore[arg-type]


def figure_of(s: Summary | None, key: str) -> float | None:
    """The figure a limit key is on, read off a Summary (a ledger keeps the key of the limit it predicted)."""
    return Limit(key, *key.removesuffix(LIMIT_SUFFIX).split("_"), limit_ms=1.0).figure(s)  # type: ignore[misc]


@dataclass(frozen=True)
class GoalView:
    metric: str  # the objective's figure of a window (output_tok_s_per_card, output_tok_s, qps, goodput)
    window: str  # native | whole
    limits: tuple[Limit, ...]  # sorted by key
    output_len: int | None = None
    all_succeed: bool = True
    cards: int | None = None
    min_cache_hit: float | None = None
    least_gain: float = 0.01  # the least relative gain the goal cares about (stop.min_gain_pct / 100)

    # -- the objective ----------------------------------------------------------------------------------------
    def objective(self, s: Summary | None, window: str | None = None) -> float | None:
        """The objective figure of a run in `window` (the goal's own by default); None when that window has none."""
        if s is None:
            return None
        w = s.native if (window or self.window) == "native" else s.whole
        got = None if w is None else getattr(w, self.metric, None)
        return None if got is None else float(got)

    # -- the limits ---------------------------------------------------------------------------------------------
    def binding(self, s: Summary | None) -> Limit | None:
        """The limit with the least relative slack at this run (module function `binding`)."""
        return binding(self.limits, s)

    def slack(self, s: Summary | None) -> float | None:
        """The binding limit's slack at this run (None: no limit, or it is unmeasured)."""
        b = self.binding(s)
        return None if b is None else b.slack(s)

    def decode_limit(self, s: Summary | None = None) -> Limit | None:
        """The limit a decode-side knob (the decode batch, C, a draft) moves: the tightest TPOT/ITL/E2E limit."""
        return binding(tuple(x for x in self.limits if x.decode_side), s)

    def prefill_limit(self, s: Summary | None = None) -> Limit | None:
        """The limit prefill queueing moves: the tightest TTFT/E2E limit."""
        return binding(tuple(x for x in self.limits if x.prefill_side), s)

    def broken(self, s: Summary | None) -> tuple[Limit, ...]:
        """The limits a run breaks (as the goal's SLO violations name them): unmeasured, or not strictly under."""
        return tuple(x for x in self.limits if not x.kept(x.figure(s)))

    def excess(self, s: Summary | None) -> float:
        """How far the run breaks its worst limit, relative (0 when every limit holds or none is measured)."""
        worst = 0.0
        for lim in self.limits:
            got = lim.figure(s)
            if got is not None and got >= lim.limit_ms:
                worst = max(worst, got / lim.limit_ms - 1.0 + 1e-9)
        return worst

    def slos(self) -> dict[str, float]:
        """Per-request SLOs for goodput (core.metrics.summarize): each latency's tightest limit."""
        out: dict[str, float] = {}
        for lim in self.limits:
            name = f"{lim.metric}_ms"
            out[name] = min(lim.limit_ms, out.get(name, lim.limit_ms))
        return out

    # -- the contract ---------------------------------------------------------------------------------------------
    def contract_breaks(self, s: Summary | None) -> list[str]:
        """What a run breaks of the contract (all succeed, output length, cards, cache hit), in words."""
        if s is None:
            return ["no figures"]
        out = []
        if self.all_succeed and s.n_failed:
            out.append(f"{s.n_failed} requests failed")
        if self.output_len is not None and s.output_len_min is not None \
                and (s.output_len_min, s.output_len_max) != (self.output_len,) * 2:
            out.append(f"outputs {s.output_len_min}..{s.output_len_max}, not all {self.output_len}")
        if self.cards is not None and s.cards < self.cards:
            out.append(f"uses {s.cards} card(s), the goal requires {self.cards}")
        if self.min_cache_hit is not None and (s.cache_hit is None or s.cache_hit < self.min_cache_hit):
            out.append(f"cache hit {s.cache_hit} below {self.min_cache_hit}")
        return out


class GoalObjective(Protocol):
    """What is maximised, in which window."""

    @property
    def metric(self) -> Literal["output_tok_s_per_card", "output_tok_s", "qps", "goodput"]: ...
    @property
    def window(self) -> Literal["native", "whole"]: ...
    def value(self, summary: Summary) -> float | None: ...
    def model_dump_json(self, *, exclude_none: bool = False) -> str: ...


class GoalConstraints(Protocol):
    """The SLO: latency limits (`<metric>_<stat>_ms_lt`), the contract's figures."""

    @property
    def all_succeed(self) -> bool: ...
    @property
    def output_len(self) -> int | None: ...
    @property
    def cards(self) -> int | None: ...
    @property
    def min_cache_hit(self) -> float | None: ...
    def latency_limits(self) -> dict[str, float]: ...
    def violations(self, summary: Summary) -> list[str]: ...
    def model_dump_json(self, *, exclude_none: bool = False) -> str: ...


class GoalProtocol(Protocol):
    """The experiment protocol: a screen's N, a confirm's (larger) N, the warm-up, the seeds."""

    @property
    def screen_n(self) -> int: ...
    @property
    def confirm_n(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def seeds(self) -> tuple[int, ...]: ...


class GoalStop(Protocol):
    """When a goal stops: K experiments in a row that changed nothing, the least gain worth a run."""

    @property
    def max_without_improvement(self) -> int: ...
    @property
    def min_gain_pct(self) -> float: ...


@runtime_checkable
class PlannerGoal(Protocol):
    """The goal as the planner reads it (History.goal): the pure part of the validated spec (state/goal.py GoalSpec
    is one), so the planner, which imports only core/ and prompts/, types it without the store's validation."""

    @property
    def engine(self) -> str: ...
    @property
    def scenario(self) -> str: ...
    @property
    def objective(self) -> GoalObjective: ...
    @property
    def constraints(self) -> GoalConstraints: ...
    @property
    def protocol(self) -> GoalProtocol: ...
    @property
    def stop(self) -> GoalStop: ...
    @property
    def authorisation(self) -> Mapping[str, str]: ...
    def space(self) -> dict[str, tuple[Any, ...]]: ...
    def view(self) -> GoalView: ...


def goal_view(goal: PlannerGoal) -> GoalView:
    """The view of a validated goal (state/goal.py GoalSpec: its objective, constraints and stop rules)."""
    c = goal.constraints
    limits = tuple(sorted((limit_of(k, v) for k, v in c.latency_limits().items()), key=lambda x: x.key))
    return GoalView(metric=goal.objective.metric, window=goal.objective.window, limits=limits,
                    output_len=c.output_len, all_succeed=c.all_succeed, cards=c.cards, min_cache_hit=c.min_cache_hit,
                    least_gain=goal.stop.min_gain_pct / 100.0)
