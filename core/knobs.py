"""The knob catalog: one definition of every tunable knob, read from knobs.yaml.

Validation lives here so that the executor, the planner and the API refuse the same values
with the same message (field name + reason).
"""
from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

CostClass = Literal["hot", "restart", "relayout", "topology", "rebuild"]
COST_ORDER: dict[str, int] = {"hot": 0, "restart": 1, "relayout": 2, "topology": 3, "rebuild": 4}


class KnobError(ValueError):
    """A knob value was refused; the message names the knob and the reason."""

    def __init__(self, knob: str, reason: str):
        super().__init__(f"{knob}: {reason}")
        self.knob = knob
        self.reason = reason


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
    role: Literal["prefill", "decode"] | None = None
    # rendered on prefill and decode instances alike in a PD deployment, though `role` is where its effect shows:
    # the KV hand-off needs both sides to agree (speculative decoding: vLLM's NIXL handshake compares the
    # speculative config; SGLang's prefill runs the draft to hand its hidden states to decode)
    both_roles: bool = False
    quality_risk: bool = False
    depends_on: tuple[Dependency, ...] = ()
    description: str = ""
    engines: dict[str, str] = {}

    def coerce(self, value: Any) -> Any:
        """Return the value in the knob's type, or raise KnobError naming the knob and reason."""
        if self.type == "enum" and isinstance(value, str) and value in (self.choices or ()):
            return value  # an enum choice spelled "none" is a value, not an empty knob
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if self.nullable:
                return None
            raise KnobError(self.name, "may not be empty")
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                return value.lower() in ("true", "1", "yes", "on")
            raise KnobError(self.name, f"expected a boolean, got {value!r}")
        if self.type == "enum":
            if not isinstance(value, str) or value not in (self.choices or ()):
                raise KnobError(self.name, f"must be one of {list(self.choices or ())}, got {value!r}")
            return value
        if isinstance(value, bool):
            raise KnobError(self.name, f"expected a number, got {value!r}")
        if self.allow_inf and (value == "inf" or (isinstance(value, float) and math.isinf(value))):
            return math.inf
        try:
            if self.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                num: float = int(str(value)) if isinstance(value, str) else int(value)
            else:
                num = float(value)
        except (TypeError, ValueError):
            raise KnobError(self.name, f"expected {'an integer' if self.type == 'int' else 'a number'}, got {value!r}") from None
        if math.isnan(num) or math.isinf(num):
            raise KnobError(self.name, f"must be finite, got {value!r}")
        if self.min is not None and num < self.min:
            raise KnobError(self.name, f"{num} is below the minimum {self.min:g}")
        if self.max is not None and num > self.max:
            raise KnobError(self.name, f"{num} is above the maximum {self.max:g}")
        return num


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)
    knobs: tuple[Knob, ...]

    def __contains__(self, name: str) -> bool:
        return any(k.name == name for k in self.knobs)

    def get(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KnobError(name, "no such knob in the catalog")

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
                raise KnobError(name, f"not a knob of engine {engine!r}")
            out[name] = knob.coerce(value)
        merged = {k.name: k.default for k in self.knobs} | out
        for name, value in out.items():
            knob = self.get(name)
            if value == knob.default:
                continue
            for dep in knob.depends_on:
                if not dep.holds(merged):
                    raise KnobError(name, f"needs {dep.knob} {dep.op} {dep.value!r} first")
        return out


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    text = resources.files("core").joinpath("knobs.yaml").read_text()
    return Catalog.model_validate(yaml.safe_load(text))
