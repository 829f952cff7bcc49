"""What the planner reads from the goal's twin: one fit (`TwinFit`, executor.twin.Twin is one) and the fitter the
loop hands over with the history (`Fitter`: run ids -> the twin fitted on them, or why not). Apart from
agent/planner/twin.py so that History (which twin.py reads) can name the fitter's type."""
from __future__ import annotations

from typing import Any, Callable, Protocol, Union


class TwinFit(Protocol):
    """One fit of the twin (executor.twin.Twin): `predict(...)["summary"]` is the station's predicted Summary."""

    runs: tuple[str, ...]
    origin: str  # where its fit started: the prior profile's name, or how a derived prior was derived

    def predict(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                slos: dict[str, float] | None = None, native: tuple[int, float] | None = None) -> dict[str, Any]: ...

    def coefficients(self) -> dict[str, tuple[float, float | None, str]]: ...


Fitter = Callable[[tuple[str, ...]], Union[TwinFit, str]]  # run ids -> the twin fitted on them, or why not
