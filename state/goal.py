"""The goal spec: what the user asked for, validated once, never changed by the loop.

A goal fixes the objective, the constraints (the SLO), the scenario and the authority the loop has.
It is frozen: the loop reads it, only a person can post a new goal. Every knob and value is checked
against the one knob catalog, and every error names the field and the reason.
"""
from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from core import datafiles, profiles, scenarios
from core.canonical import canon
from core.bounded import BoundsError, excerpt, load_json, load_yaml
from core.goalview import GoalView, goal_view
from core.limits import LATENCIES, STATS, Limit, Terms, limit_key, tightest
from core.datafiles import DataFileError, read_text
from core.errors import FieldError
from core.knobs import KnobError, KnobErrorKind, catalog, drafts_nothing
from core.summary import Contract, Summary
from state.errors import GoalError
from state.space import default_space

ActionClass = Literal["hot", "restart", "relayout", "topology", "rebuild", "quality_risk", "profile", "budget_extension"]
ACTION_CLASSES: tuple[str, ...] = ActionClass.__args__  # type: ignore[attr-defined]
Permission = Literal["auto", "ask", "deny"]
DEFAULT_AUTHORISATION: dict[str, str] = {
    "hot": "auto", "restart": "ask", "relayout": "ask", "topology": "ask", "rebuild": "deny",
    "quality_risk": "ask", "profile": "ask", "budget_extension": "ask",
}
REPORTABLE = tuple(f"{m}_{s}_ms" for m in LATENCIES for s in STATS) + (
    "achieved_concurrency", "qps", "goodput", "cache_hit", "output_tok_s", "output_tok_s_per_card", "queue_delay_p99_ms")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _bounded(lo: float, hi: float, *, integer: bool = False, lo_open: bool = False, unit: str = "") -> Any:
    """A finite number within [lo, hi] ((lo, hi] with lo_open), refused with the field's range otherwise
    (Infinity, 1e309, 10**20 ...). The bounds also go into the JSON schema."""
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    rng = f"{'(' if lo_open else '['}{num(lo)}, {num(hi)}]{unit}"
    what = "an integer" if integer else "a finite number"

    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v  # strings, None ...: pydantic's own parsing names the problem
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"must be {what} in {rng}, not {v}")
        if (v <= lo if lo_open else v < lo) or v > hi:
            raise ValueError(f"must be {what} in {rng}")
        return v

    typ = int if integer else float
    limits = {"gt" if lo_open else "ge": typ(lo), "le": typ(hi)}
    return Annotated[typ, BeforeValidator(check), Field(**limits)]


# the ranges of every number of a goal (a goal beyond them is a typo, never a plan)
LatencyMs = _bounded(0, 3_600_000, lo_open=True, unit=" ms")
Count = _bounded(1, 1_000_000, integer=True)
Seconds = _bounded(0, 7 * 86400, lo_open=True, unit=" s")
CardHours = _bounded(0, 1_000_000, lo_open=True, unit=" card-hours")
Experiments = _bounded(1, 100_000, integer=True)
Warmup = _bounded(0, 100_000, integer=True)
Seed = _bounded(0, 2**32 - 1, integer=True)
Cards = _bounded(1, 100_000, integer=True)
Share = _bounded(0, 1)
Streak = _bounded(1, 10_000, integer=True)
Percent = _bounded(0, 10_000, unit=" %")


class Objective(_Frozen):
    metric: Literal["output_tok_s_per_card", "output_tok_s", "qps", "goodput"] = "output_tok_s_per_card"
    window: Literal["native", "whole"] = "native"
    direction: Literal["max"] = "max"

    def value(self, summary: Summary) -> float | None:
        """The objective figure of one run; None when the window has no figure (never 0)."""
        w = summary.native if self.window == "native" else summary.whole
        return None if w is None else getattr(w, self.metric)


_LatencyLimits = create_model(  # type: ignore[call-overload]
    "_LatencyLimits", __base__=_Frozen,
    **{limit_key(m, s): (LatencyMs | None, None) for m in LATENCIES for s in STATS},
)


class Constraints(_LatencyLimits):  # type: ignore[misc, valid-type]
    """The SLO. Latency limits are strict (`_lt`): a mean TPOT of exactly 20 ms breaks `tpot_mean_ms_lt: 20`."""

    all_succeed: bool = True
    output_len: Count | None = None  # type: ignore[valid-type]
    cards: Cards | None = None  # type: ignore[valid-type]
    min_cache_hit: Share | None = None  # type: ignore[valid-type]

    @property
    def terms(self) -> Terms:
        """The latency limits and the contract a valid run must keep (core/limits.py), made from the validated
        fields (a limit from its metric and statistic, in the schema's order; never from its name). A property,
        not a copy kept at validation, so a `model_copy(update=...)` of the constraints reads its own."""
        limits = tuple(Limit(m, s, float(v)) for m in LATENCIES for s in STATS
                       if (v := getattr(self, limit_key(m, s))) is not None)
        return Terms(limits, all_succeed=self.all_succeed, output_len=self.output_len, cards=self.cards,
                     min_cache_hit=self.min_cache_hit)

    def latency_limits(self) -> dict[str, float]:
        """The schema's name of each limit the goal sets, and its bound in ms."""
        return {lim.key: lim.limit_ms for lim in self.terms.limits}

    def violations(self, summary: Summary) -> list[str]:
        """Every constraint the run broke, as the records' lines ("field: words"); empty means the SLO holds."""
        return [str(v) for v in self.terms.violations(summary)]


class ExperimentProtocol(_Frozen):
    screen_n: Count = 320  # type: ignore[valid-type]
    confirm_n: Count = 640  # type: ignore[valid-type]
    warmup: Warmup = 0  # type: ignore[valid-type]
    native_min_requests: Count = 128  # type: ignore[valid-type]
    native_min_seconds: Seconds = 60.0  # type: ignore[valid-type]
    seeds: tuple[Seed, ...] = Field((0,), min_length=1, max_length=16)  # type: ignore[valid-type]

    @field_validator("confirm_n")
    @classmethod
    def _confirm_larger(cls, v: int, info: ValidationInfo) -> int:
        """A confirmation is a longer run of the same scenario: at the screen's N it would repeat the screen."""
        screen = info.data.get("screen_n", 0)
        if v < screen:
            raise ValueError(f"confirm_n {v} is smaller than screen_n {screen}")
        if v == screen:
            raise ValueError(f"confirm_n {v} equals screen_n: a confirmation must run more requests than the screen")
        return v


class Budget(_Frozen):
    card_hours: CardHours  # type: ignore[valid-type]
    experiments: Experiments  # type: ignore[valid-type]
    deadline: datetime | None = None


class StopRules(_Frozen):
    # valid experiments in a row that changed nothing; the least gain a candidate must be expected to bring
    max_without_improvement: Streak = 4  # type: ignore[valid-type]
    min_gain_pct: Percent = 1.0  # type: ignore[valid-type]
    stop_on_unknown: Literal[True] = True  # an UNKNOWN run state always stops the loop


class GoalSpec(_Frozen):
    name: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    engine: str = "sim"
    scenario: str
    target: str = "sim"
    sim_profile: str | None = "dsv4-flash-910c-p8d8"
    objective: Objective = Objective()
    constraints: Constraints
    reported: tuple[str, ...] = ("ttft_mean_ms", "ttft_p90_ms")
    start_knobs: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, tuple[Any, ...]] | None = None
    protocol: ExperimentProtocol = ExperimentProtocol()
    authorisation: dict[ActionClass, Permission] = Field(default_factory=lambda: dict(DEFAULT_AUTHORISATION))
    budget: Budget
    stop: StopRules = StopRules()

    @field_validator("engine")
    @classmethod
    def _engine_known(cls, v: str) -> str:
        known = sorted({e for k in catalog().knobs for e in k.engines} - {"bench"})
        if v not in known:
            raise ValueError(f"unknown engine {v!r}; known: {known}")
        return v

    @field_validator("scenario")
    @classmethod
    def _scenario_exists(cls, v: str) -> str:
        """A name in the data directories, never a path (core/datafiles.py); the file must be valid."""
        datafiles.resolve_name("scenarios", "scenario", v)
        scenarios.load(v)  # DataFileError: names the file's field and reason, never its content
        return v

    @field_validator("sim_profile")
    @classmethod
    def _profile_exists(cls, v: str | None) -> str | None:
        """Like `scenario`: a profile by name, valid, or null (a real engine)."""
        if v is None:
            return None
        datafiles.resolve_name("profiles", "profile", v)
        profiles.load(v)
        return v

    @field_validator("constraints")
    @classmethod
    def _output_len_matches(cls, v: Constraints, info: ValidationInfo) -> Constraints:
        if v.output_len is not None and "scenario" in info.data:
            want = scenarios.load(info.data["scenario"]).output_len
            if want is None:
                raise ValueError(f"output_len: scenario {info.data['scenario']!r} takes each request's output length "
                                 "from its source file; leave output_len out")
            if v.output_len != want:
                raise ValueError(f"output_len {v.output_len} differs from scenario {info.data['scenario']!r} ({want})")
        return v

    @field_validator("reported")
    @classmethod
    def _reported_known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [m for m in v if m not in REPORTABLE]
        if bad:
            raise ValueError(f"unknown metric(s) {bad}; known: {list(REPORTABLE)}")
        return v

    @field_validator("start_knobs")
    @classmethod
    def _start_valid(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        out = catalog().validate(v, engine=info.data.get("engine"))  # a KnobError names the knob (_errors)
        why = drafts_nothing(catalog().defaults(info.data.get("engine") or "sim") | out)  # a draft of width 0
        if why is not None:
            raise why
        return out

    @field_validator("search_space")
    @classmethod
    def _space_valid(cls, v: dict[str, tuple[Any, ...]] | None, info: ValidationInfo) -> dict[str, tuple[Any, ...]] | None:
        if v is None:
            return None
        out: dict[str, tuple[Any, ...]] = {}
        engine = info.data.get("engine")
        for name, values in v.items():  # a KnobError names the knob (_errors)
            knob = catalog().get(name)
            if engine is not None and engine not in knob.engines and knob.cost_class != "hot":
                raise KnobError(name, f"not a knob of engine {engine!r}", KnobErrorKind.ENGINE)
            if not values:
                raise KnobError(name, "needs at least one value", KnobErrorKind.SPACE)
            if len(values) > 1000:
                raise KnobError(name, "at most 1000 values", KnobErrorKind.SPACE)
            out[name] = tuple(knob.coerce(x) for x in values)
        return out

    @model_validator(mode="after")
    def _start_in_space(self) -> "GoalSpec":
        """A start knob the goal's search space names takes one of the space's values: the loop never moves
        back to a value outside it, so a start outside it is a typo or a space that forgot it."""
        for name, value in self.start_knobs.items():
            values = (self.search_space or {}).get(name)
            if values is not None and not any(canon(value) == canon(v) for v in values):
                raise FieldError(f"start_knobs.{name}", f"{value!r} is not one of the search space's values for "
                                 f"{name}: {list(values)} (add it to search_space.{name}, or start from one of them)")
        return self

    @field_validator("authorisation")
    @classmethod
    def _fill_authorisation(cls, v: dict[str, str]) -> dict[str, str]:
        return dict(DEFAULT_AUTHORISATION) | dict(v)

    # -- derived views -------------------------------------------------------------------------------
    def space(self) -> dict[str, tuple[Any, ...]]:
        """The search space in force: the goal's own, or the catalog's default for its engine."""
        if self.search_space is not None:
            return dict(self.search_space)
        return {k: tuple(v) for k, v in default_space(self.engine).items()}

    def start_station(self) -> dict[str, Any]:
        """The full starting station. On the simulator: catalog defaults < the profile's layout, defaults
        and own start < the goal's start_knobs; elsewhere: catalog defaults < start_knobs."""
        if self.engine == "sim" and self.sim_profile:
            return profiles.load(self.sim_profile).knobs(dict(self.start_knobs), start=True)
        return catalog().defaults(self.engine) | dict(self.start_knobs)

    def contract(self) -> Contract:
        """The scenario contract a valid run of this goal must keep (executor.verdict judges it)."""
        sc = scenarios.load(self.scenario)
        return Contract(
            output_len=self.constraints.output_len or sc.output_len,
            all_succeed=self.constraints.all_succeed,
            zero_cache=sc.zero_cache,
            min_request_hit=sc.min_request_hit,
            cards_required=self.constraints.cards,
        )

    def slos(self) -> dict[str, float]:
        """Per-request SLOs for goodput (core.metrics.summarize): `ttft_ms`, `tpot_ms`, `e2e_ms`, `itl_ms`."""
        return tightest(self.constraints.terms.limits)

    def view(self) -> GoalView:
        """The planner's view of this goal (core/goalview.py): limits as typed rows, the binding one, the contract."""
        return goal_view(self)

    def spec_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def _errors(e: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in e.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(goal)"
        msg = excerpt(err["msg"].removeprefix("Value error, "), 400)  # a message that repeats a huge value
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, DataFileError):  # names a file and why, never its content: kept whole (its known names)
            msg = str(cause)
        elif isinstance(cause, FieldError):  # the refused field under the one validated (a knob of start_knobs)
            field, msg = f"{field}.{cause.field}" if field != "(goal)" else cause.field, excerpt(cause.reason, 400)
        out.append((field, msg))
    return out


def parse_goal(data: Any, source: str = "<goal>") -> GoalSpec:
    """Validate a mapping as a goal; raises GoalError listing every field and reason."""
    if not isinstance(data, dict):
        raise GoalError(source, [("(goal)", f"expected a mapping, got {type(data).__name__}")])
    try:
        return GoalSpec.model_validate(data)
    except ValidationError as e:
        raise GoalError(source, _errors(e)) from None


def load_goal(path: str | Path) -> GoalSpec:
    """Read a goal from YAML or JSON (by suffix; YAML otherwise)."""
    p = Path(path)
    try:
        text = read_text(p, "goal file")
    except DataFileError as e:
        raise GoalError(str(p), [("(file)", str(e).removeprefix("goal file: "))]) from None
    try:
        data = load_json(text) if p.suffix.lower() == ".json" else load_yaml(text)
    except BoundsError as e:
        raise GoalError(str(p), [("(file)", str(e))]) from None
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise GoalError(str(p), [("(file)", f"not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {e}")]) from None
    return parse_goal(data, str(p))
