"""The default discrete search space, derived from the knob catalog.

The loop searches over discrete values (a candidate changes one knob to one listed value), so every
knob's range is cut into a short list: enums and booleans as they are, integers by powers of two,
floats on a few even steps, always including the default.
"""
from __future__ import annotations

import math
from typing import Any

from core.knobs import Catalog, Knob, catalog


def _ints(knob: Knob) -> list[Any]:
    lo, hi = int(knob.min if knob.min is not None else 1), int(knob.max if knob.max is not None else 1024)
    vals = {2 ** i for i in range(0, 31) if lo <= 2 ** i <= hi}
    if lo == 0:
        vals.add(0)
    if knob.default is not None:
        vals.add(int(knob.default))
    return sorted(vals)


def _floats(knob: Knob) -> list[Any]:
    if knob.min is None or knob.max is None:
        base = float(knob.default or 1.0)
        vals = {base * f for f in (0.5, 1.0, 1.5, 2.0)}
    elif knob.max / max(knob.min, 1e-9) > 100:  # wide range (a rate): geometric steps around the default
        base = float(knob.default if knob.default is not None else knob.min)
        vals = {round(base * f, 6) for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0) if knob.min <= base * f <= knob.max}
    else:
        vals = {round(knob.min + (knob.max - knob.min) * i / 4, 6) for i in range(5)}
        if knob.default is not None:
            vals.add(float(knob.default))
    out: list[Any] = sorted(vals)
    if knob.allow_inf:
        out.append(math.inf)
    return out


def knob_values(knob: Knob) -> list[Any]:
    """The discrete values the loop may try for one knob."""
    if knob.type == "bool":
        vals: list[Any] = [False, True]
    elif knob.type == "enum":
        vals = list(knob.choices or ())
    elif knob.type == "int":
        vals = _ints(knob)
    else:
        vals = _floats(knob)
    if knob.nullable:
        vals = [None] + vals
    return vals


def default_space(engine: str = "sim", cat: Catalog | None = None) -> dict[str, list[Any]]:
    """Every knob the engine has (plus the load knobs), each with its discrete values."""
    cat = cat or catalog()
    return {k.name: knob_values(k) for k in cat.knobs if engine in k.engines or k.cost_class == "hot"}
