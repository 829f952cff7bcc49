"""The goal as the planner reads it: the objective, the latency limits as typed rows, the contract.

A goal may limit any latency at any statistic (TTFT p99, mean TPOT, E2E p90 ...) and maximise any objective the
schema allows (output tok/s per card, output tok/s, qps, goodput). The planner never names a limit key: it asks
this view which limit binds at a run (the least relative slack), how much slack it leaves, which figure of a
Summary it is on, and which limit a decode-side knob moves (TPOT, ITL; E2E with either side) against a
prefill-side one (TTFT; E2E). The validated spec (state/goal.py GoalSpec) derives this view; it is pure.

Every reader (the report and its plots, the dashboard and its API, chat `status`, Slack/Feishu and experiment cards)
shows a goal through the same view: its objective in its own unit (`objective_words`, `unit`), each limit at its own
statistic and the figures the goal asked to report (`columns`, one `Figure` each), its SLO in words (`slo_words`), and
a change between two figures as `change` words it (a percentage, or the two values where the parent is near zero).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Mapping, Protocol, runtime_checkable

from core.limits import LATENCIES, NAMES, STATS, Limit, Terms, Violation, binding, figure_key, latency, tightest
from core.summary import Summary

UNITS = {"output_tok_s_per_card": "tok/s/card", "output_tok_s": "tok/s", "qps": "req/s", "goodput": "req/s"}
SHORT = {"output_tok_s_per_card": "output tok/s/card", "output_tok_s": "output tok/s", "qps": "QPS", "goodput": "goodput",
         "achieved_concurrency": "achieved concurrency"}  # a window's figures, as a column names them
WINDOW_FIGURES = tuple(SHORT)
MAX_PCT = 10.0  # the largest change shown as a percentage (+1000 %): beyond it, or from a near-zero parent, the values
NEAR_ZERO = 1e-9
# the latency figures a reader may show (each limit's, the schema's `reported` ones), to their (metric, stat)
LATENCY_FIGURES: dict[str, tuple[str, str]] = {figure_key(m, s): (m, s) for m in LATENCIES for s in STATS} | {
    "queue_delay_p99_ms": ("queue_delay", "p99")}


def change(new: float | None, old: float | None, unit: str = "", digits: int = 2, tight: bool = False) -> str | None:
    """A change a person reads: `+12.34 %` of the parent (`+12.34%` tight), or `0.07 -> 6.97 req/s` where the parent
    figure is near zero or the change is beyond +-1000 % (such a percentage says nothing); None where either is missing."""
    if new is None or old is None:
        return None
    if abs(old) > NEAR_ZERO and abs(new / old - 1.0) <= MAX_PCT:
        return f"{(new / old - 1.0) * 100:+.{digits}f}{'' if tight else ' '}%"
    return f"{old:.{digits}f} -> {new:.{digits}f}" + (f" {unit}" if unit else "")


def effect(rel: float | None, base: float | None = None, unit: str = "", digits: int = 1,
           tight: bool = False) -> str | None:
    """A relative effect (0.10 = +10 %; `+10.0%` tight) as `change` words it against `base` where given; without one,
    beyond +-1000 % the factor (`x93.3`)."""
    if rel is None:
        return None
    if base is not None:
        return change(base * (1.0 + rel), base, unit, digits, tight)
    return f"{rel * 100:+.{digits}f}{'' if tight else ' '}%" if abs(rel) <= MAX_PCT else f"x{1.0 + rel:.{max(digits, 1)}f}"


@dataclass(frozen=True)
class Figure:
    """One figure a reader shows of a run: a limit's (at its statistic, with the limit) or one the goal reports."""

    key: str  # the summary's name of it: ttft_p99_ms, e2e_mean_ms, qps, cache_hit, queue_delay_p99_ms ...
    words: str  # the column's head: "TTFT p99 ms", "QPS (native)"
    limit_ms: float | None = None  # the goal's limit on it (None: reported only)
    window: str = "whole"  # for a window's figure (qps, goodput ...)

    @property
    def digits(self) -> int:
        if self.key == "cache_hit":
            return 4
        return 2 if self.key.startswith(("tpot", "itl")) or not self.key.endswith("_ms") else 1

    def read(self, s: Summary | None) -> float | None:
        """The figure off a run's Summary (None: unmeasured, or no such window)."""
        if s is None:
            return None
        if self.key in WINDOW_FIGURES:
            w = s.native if self.window == "native" else s.whole
            got = None if w is None else getattr(w, self.key, None)
        elif self.key == "cache_hit":
            got = s.cache_hit
        else:
            return latency(s, *LATENCY_FIGURES[self.key]) if self.key in LATENCY_FIGURES else None
        return None if got is None else float(got)

    def text(self, s: Summary | None) -> str:
        """The figure as a table cell: empty where unmeasured, never 0."""
        got = self.read(s)
        return "" if got is None else f"{got:.{self.digits}f}"


def figure_named(key: str, window: str = "whole", limit_ms: float | None = None) -> Figure:
    """A Figure for a summary figure's name (a limit's `figure_key` or one of the schema's `reported` names)."""
    if key in WINDOW_FIGURES:
        return Figure(key, f"{SHORT[key]} ({window})", None, window)
    if key == "cache_hit":
        return Figure(key, "cache hit", None)
    if key not in LATENCY_FIGURES:
        return Figure(key, key, limit_ms)  # a figure this version does not name: its key
    metric, stat = LATENCY_FIGURES[key]
    name = NAMES.get(metric, metric.replace("_", " "))
    return Figure(key, f"{'mean ' + name if stat == 'mean' else name + ' ' + stat} ms", limit_ms)


@dataclass(frozen=True)
class GoalView:
    metric: str  # the objective's figure of a window (output_tok_s_per_card, output_tok_s, qps, goodput)
    window: str  # native | whole
    terms: Terms  # the latency limits and the contract (core/limits.py), as the goal was validated
    least_gain: float = 0.01  # the least relative gain the goal cares about (stop.min_gain_pct / 100)
    reported: tuple[str, ...] = ()  # the figures the goal asked to report beside its limits (the schema's names)

    @cached_property
    def limits(self) -> tuple[Limit, ...]:
        """The latency limits, sorted by key."""
        return tuple(sorted(self.terms.limits, key=lambda x: x.key))

    # -- what a person reads ------------------------------------------------------------------------------------
    @property
    def unit(self) -> str:
        return UNITS.get(self.metric, "")

    @property
    def objective_words(self) -> str:
        """`goodput (req/s, whole window)`: the objective as a heading names it."""
        name = SHORT.get(self.metric, self.metric)
        return f"{name} ({'' if self.unit in name else self.unit + ', '}{self.window} window)"

    def columns(self) -> tuple[Figure, ...]:
        """The figures a table shows beside the objective: each limit at its own statistic (by key), then each
        figure the goal reports that is neither a limit's nor the objective's own; nothing else."""
        out = [figure_named(x.figure_key, limit_ms=x.limit_ms) for x in self.limits]
        seen = {f.key for f in out} | {self.metric}
        out += [figure_named(k, self.window) for k in self.reported if k not in seen]
        return tuple(out)

    def axes(self, s: Summary | None = None) -> tuple[Figure, ...]:
        """The latencies a frontier is drawn against: the limit binding at `s` first, then each other limit; a goal
        without a limit: the latencies it reports."""
        first = self.binding(s)
        lims = ([first] if first else []) + [x for x in self.limits if x is not first]
        if lims:
            return tuple(figure_named(x.figure_key, limit_ms=x.limit_ms) for x in lims)
        return tuple(f for f in self.columns() if f.key.endswith("_ms"))

    def slo_words(self) -> str:
        """The goal's own SLO: `TTFT p99 < 2000 ms, TPOT p99 < 35 ms`."""
        return ", ".join(f"{x.words} < {x.limit_ms:g} ms" for x in self.limits) or "no latency limit"

    def figures_words(self, s: Summary | None) -> str:
        """`goodput: whole 6.97 / native — req/s at N=640; TTFT p99 1843.2 ms (< 2000), TPOT p99 31.20 ms (< 35)`: the
        objective in its window first (a window without a valid figure: —), then each column."""
        if s is None:
            return "no figures"
        wins = (self.window, "whole" if self.window == "native" else "native")
        got = " / ".join(f"{w} " + ("—" if self.objective(s, w) is None else f"{self.objective(s, w):.2f}") for w in wins)
        figs = [f"{f.words.removesuffix(' ms')} " + (f"{f.text(s) or '—'} ms" if f.key.endswith("_ms") else f.text(s) or "—")
                + (f" (< {f.limit_ms:g})" if f.limit_ms is not None else "") for f in self.columns()]
        return f"{SHORT.get(self.metric, self.metric)}: {got} {self.unit} at N={s.n_formal}" + ("; " + ", ".join(figs) if figs else "")

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
        return tightest(self.limits)

    # -- the contract ---------------------------------------------------------------------------------------------
    def violations(self, s: Summary) -> tuple[Violation, ...]:
        """What a run breaks of the goal: its limits and its contract (core/limits.py Terms.violations)."""
        return self.terms.violations(s)


class GoalObjective(Protocol):
    """What is maximised, in which window."""

    @property
    def metric(self) -> Literal["output_tok_s_per_card", "output_tok_s", "qps", "goodput"]: ...
    @property
    def window(self) -> Literal["native", "whole"]: ...
    def value(self, summary: Summary) -> float | None: ...
    def model_dump_json(self, *, exclude_none: bool = False) -> str: ...


class GoalConstraints(Protocol):
    """The SLO: latency limits (parsed once into `terms`, core/limits.py), the contract's figures."""

    @property
    def all_succeed(self) -> bool: ...
    @property
    def output_len(self) -> int | None: ...
    @property
    def cards(self) -> int | None: ...
    @property
    def min_cache_hit(self) -> float | None: ...
    @property
    def terms(self) -> Terms: ...
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
    @property
    def reported(self) -> tuple[str, ...]: ...


def goal_view(goal: PlannerGoal) -> GoalView:
    """The view of a validated goal (state/goal.py GoalSpec: its objective, constraints and stop rules)."""
    return GoalView(metric=goal.objective.metric, window=goal.objective.window, terms=goal.constraints.terms,
                    least_gain=goal.stop.min_gain_pct / 100.0, reported=tuple(goal.reported))
