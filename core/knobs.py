"""The knob catalog: one definition of every tunable knob, read from knobs.yaml.

Validation lives here so that the executor, the planner and the API refuse the same values
with the same message (field name + reason).
"""
from __future__ import annotations

import difflib
import math
from functools import cached_property, lru_cache
from importlib import resources
import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from core.errors import FieldError

CostClass = Literal["hot", "restart", "relayout", "topology", "rebuild"]
COST_ORDER: dict[str, int] = {"hot": 0, "restart": 1, "relayout": 2, "topology": 3, "rebuild": 4}

# Knob roles: what a knob does, whatever an engine calls it. The planner reads these, never knob names, so a rule
# written for one engine's batch cap moves another's (vLLM --max-num-seqs, SGLang --max-running-requests,
# llama.cpp --parallel). Each knob in knobs.yaml plays at most one role; each engine has at most one knob per role.
CLIENT_CAP = "client_cap"                  # C: the sender's most requests in flight
ARRIVAL_RATE = "arrival_rate"              # r: the sender's arrival rate (req/s)
BATCH_CAP = "batch_cap"                    # most sequences a (decode) instance runs at once
PREFILL_TOKEN_BUDGET = "prefill_token_budget"  # tokens one prefill step may take (chunk size)
PREFILL_REQUEST_CAP = "prefill_request_cap"    # requests one prefill batch may admit
PREFILL_REQUEST_TOKEN_CAP = "prefill_request_token_cap"  # tokens one request may take from a step's budget
KV_MEMORY_FRACTION = "kv_memory_fraction"  # device memory share for weights + KV cache
PREFIX_CACHE = "prefix_cache"              # reuse of shared prompt prefixes' KV
DRAFT_METHOD = "draft_method"              # speculative decoding method
DRAFT_WIDTH = "draft_width"                # draft tokens proposed per decode step (k)
INDEX_REUSE = "index_reuse"                # cross-layer index cache reuse (a quality risk)
EXPERT_PLACEMENT = "expert_placement"      # MoE expert placement / load balancing
PREFILL_INSTANCES = "prefill_instances"    # P
DECODE_INSTANCES = "decode_instances"      # D
ROLES: tuple[str, ...] = (
    CLIENT_CAP, ARRIVAL_RATE, BATCH_CAP, PREFILL_TOKEN_BUDGET, PREFILL_REQUEST_CAP, PREFILL_REQUEST_TOKEN_CAP,
    KV_MEMORY_FRACTION, PREFIX_CACHE, DRAFT_METHOD, DRAFT_WIDTH, INDEX_REUSE, EXPERT_PLACEMENT, PREFILL_INSTANCES,
    DECODE_INSTANCES,
    # roles no planner rule reads yet, named so that every knob says what it does
    "tensor_parallel_width", "data_parallel_replicas", "expert_parallel", "attention_dp_groups", "cpu_threads",
    "context_tokens", "logical_batch_tokens", "physical_batch_tokens", "shared_kv_buffer",
)


class KnobErrorKind(StrEnum):
    """What kind of refusal a KnobError is, so code branches on it, never on the reason's words."""

    UNKNOWN = "unknown"  # no such knob (or role) in the catalog
    ENGINE = "engine"  # a knob the goal's engine does not have
    VALUE = "value"  # a value of the wrong type, empty, or outside the knob's range or choices
    DEPENDENCY = "dependency"  # needs another knob set first, or a combination the engine refuses (drafts nothing)
    SPACE = "space"  # a search space's list of values (none, or too many)


class KnobError(FieldError):
    """A knob value was refused; `knob` (its field), `reason` and `kind`; the message "knob: reason"."""

    def __init__(self, knob: str, reason: str, kind: KnobErrorKind):
        super().__init__(knob, reason)
        self.knob = knob
        self.kind = kind


class Dependency(BaseModel):
    model_config = ConfigDict(frozen=True)
    knob: str
    op: Literal["==", "!=", ">", ">="]
    value: Any

    def holds(self, values: dict[str, Any]) -> bool:
        v = values.get(self.knob)
        if self.op == "==":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        if v is None:
            return False
        return v > self.value if self.op == ">" else v >= self.value


class Knob(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    type: Literal["int", "float", "bool", "enum"]
    default: Any = None
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False
    allow_inf: bool = False
    cost_class: CostClass
    role: str | None = None  # one of ROLES: what the knob does, read by the planner
    side: Literal["prefill", "decode"] | None = None  # the PD instance role it acts on
    # rendered on prefill and decode instances alike in a PD deployment, though `side` is where its effect shows:
    # the KV hand-off needs both sides to agree (speculative decoding: vLLM's NIXL handshake compares the
    # speculative config; SGLang's prefill runs the draft to hand its hidden states to decode)
    both_sides: bool = False
    quality_risk: bool = False
    depends_on: tuple[Dependency, ...] = ()
    description: str = ""
    engines: dict[str, str] = {}

    @field_validator("role")
    @classmethod
    def _known_role(cls, v: str | None) -> str | None:
        if v is not None and v not in ROLES:
            raise ValueError(f"unknown role {v!r}; one of {list(ROLES)}")
        return v

    def coerce(self, value: Any) -> Any:
        """Return the value in the knob's type, or raise KnobError naming the knob and reason."""
        if self.type == "enum" and isinstance(value, str) and value in (self.choices or ()):
            return value  # an enum choice spelled "none" is a value, not an empty knob
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if self.nullable:
                return None
            raise KnobError(self.name, "may not be empty", KnobErrorKind.VALUE)
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                return value.lower() in ("true", "1", "yes", "on")
            raise KnobError(self.name, f"expected a boolean, got {value!r}", KnobErrorKind.VALUE)
        if self.type == "enum":
            if not isinstance(value, str) or value not in (self.choices or ()):
                raise KnobError(self.name, f"must be one of {list(self.choices or ())}, got {value!r}",
                                KnobErrorKind.VALUE)
            return value
        if isinstance(value, bool):
            raise KnobError(self.name, f"expected a number, got {value!r}", KnobErrorKind.VALUE)
        if self.allow_inf and (value == "inf" or value == math.inf):
            return math.inf  # only +inf means "unbounded": -inf (-Infinity, -1e400) is refused below, never flipped
        try:
            if self.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                num: float = int(str(value)) if isinstance(value, str) else int(value)
            else:
                num = float(value)
        except (TypeError, ValueError):
            raise KnobError(self.name, f"expected {'an integer' if self.type == 'int' else 'a number'}, got {value!r}",
                            KnobErrorKind.VALUE) from None
        if math.isnan(num) or math.isinf(num):
            raise KnobError(self.name, f"must be finite, got {value!r}", KnobErrorKind.VALUE)
        if self.min is not None and num < self.min:
            raise KnobError(self.name, f"{num} is below the minimum {self.min:g}", KnobErrorKind.VALUE)
        if self.max is not None and num > self.max:
            raise KnobError(self.name, f"{num} is above the maximum {self.max:g}", KnobErrorKind.VALUE)
        return num


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)
    knobs: tuple[Knob, ...]

    @model_validator(mode="after")
    def _one_knob_per_role(self) -> "Catalog":
        seen: dict[tuple[str, str], str] = {}
        for k in self.knobs:
            for engine in k.engines if k.role else ():
                other = seen.setdefault((engine, k.role), k.name)  # type: ignore[arg-type]
                if other != k.name:
                    raise FieldError(k.name, f"engine {engine!r} already has {other!r} as its {k.role}")
        return self

    @cached_property
    def by_name(self) -> dict[str, Knob]:
        return {k.name: k for k in self.knobs}

    def role_of(self, name: str) -> str | None:
        """The role a knob plays (None for a name the catalog does not hold or a knob without one)."""
        k = self.by_name.get(name)
        return None if k is None else k.role

    def named(self, role: str, among: Iterable[str]) -> str | None:
        """The knob among `among` (a deployment's knobs, a search space) that plays `role`, or None."""
        if role not in ROLES:
            raise KnobError(role, "no such role in the catalog", KnobErrorKind.UNKNOWN)
        return next((n for n in among if self.role_of(n) == role), None)

    def value(self, knobs: Mapping[str, Any], role: str) -> Any:
        """The value the knob playing `role` has in `knobs` (None when no knob there plays it)."""
        name = self.named(role, knobs)
        return None if name is None else knobs[name]

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def get(self, name: str) -> Knob:
        k = self.by_name.get(name)
        if k is None:
            near = difflib.get_close_matches(str(name), self.by_name, n=3, cutoff=0.75) if len(str(name)) <= 200 else []
            guess = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            raise KnobError(name, "no such knob in the catalog" + guess, KnobErrorKind.UNKNOWN)
        return k

    def for_engine(self, engine: str) -> list[Knob]:
        return [k for k in self.knobs if engine in k.engines]

    def defaults(self, engine: str = "sim") -> dict[str, Any]:
        return {k.name: k.default for k in self.knobs if engine in k.engines or k.cost_class == "hot"}

    def validate(self, values: dict[str, Any], engine: str | None = None) -> dict[str, Any]:
        """Coerce every value and check dependencies; raises KnobError on the first problem."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            knob = self.get(name)
            if engine is not None and engine not in knob.engines and knob.cost_class != "hot":
                raise KnobError(name, f"not a knob of engine {engine!r}", KnobErrorKind.ENGINE)
            out[name] = knob.coerce(value)
        merged = {k.name: k.default for k in self.knobs} | out
        for name, value in out.items():
            knob = self.get(name)
            if value == knob.default:
                continue
            for dep in knob.depends_on:
                if not dep.holds(merged):
                    raise KnobError(name, f"needs {dep.knob} {dep.op} {dep.value!r} first",
                                    KnobErrorKind.DEPENDENCY)
        return out


def drafts_nothing(values: Mapping[str, Any], cat: Catalog | None = None) -> KnobError | None:
    """The refusal of a station with a draft method and a draft width of 0, naming the method's knob (None when it is
    not one): vLLM refuses that speculative config at start (vllm/config/speculative.py: num_speculative_tokens
    gt=0), SGLang silently runs no draft. `values`: the full knobs (defaults filled in), read by role, so any engine's
    names for the two count. Refused at every entry: a goal's start station (state/goal.py), the twin's searches
    (agent/planner/accepted.py), every card's checks (agent/planner/checks.py) and the station the executor deploys
    (core.station.full_knobs). The width's catalog minimum stays 0: 0 is its default, the width of a station that
    runs no draft method, and the catalog validates every knob of a full station against its range."""
    cat = cat or catalog()
    method, width = cat.named(DRAFT_METHOD, values), cat.named(DRAFT_WIDTH, values)
    if method is None or width is None or values[method] in (None, "none") or values[width]:
        return None
    return KnobError(method, f"{values[method]} with {width} 0 drafts nothing (vLLM refuses that speculative config "
                     f"at start, SGLang silently runs no draft); set {width} to 1 or more, or {method} to none",
                     KnobErrorKind.DEPENDENCY)


CATALOG_ENV = "TUNELOOP_KNOB_CATALOG"  # a site's own catalog file (an in-house engine's knob names and roles)


@lru_cache(maxsize=4)
def _load(path: str | None) -> Catalog:
    text = open(path, encoding="utf-8").read() if path else resources.files("core").joinpath("knobs.yaml").read_text()
    return Catalog.model_validate(yaml.safe_load(text))


def catalog() -> Catalog:
    """The knob catalog: core/knobs.yaml, or the file $TUNELOOP_KNOB_CATALOG names (read once per path)."""
    return _load(os.environ.get(CATALOG_ENV) or None)


def role_of(name: str) -> str | None:
    return catalog().role_of(name)


def named(role: str, among: Iterable[str]) -> str | None:
    return catalog().named(role, among)


def by_role(knobs: Mapping[str, Any], role: str) -> Any:
    return catalog().value(knobs, role)
