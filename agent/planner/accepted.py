"""Which stations the knob catalog accepts, for the planner's searches (the twin's neighbourhood and ascent).

A station the catalog refuses (a value out of its knob's range, a knob the goal's engine does not have, a knob whose
dependency the station breaks: a draft width with speculative decoding off; a draft method with a draft width of
0, which vLLM refuses at start) can never run: the executor refuses it
with a KnobError (core.station.full_knobs), and so does the twin's simulator. A search that builds one crashes the
loop or, at best, spends a simulation on nothing. The same `Catalog.validate` the executor and the card checks use
(agent/planner/checks.py) decides here, so a search cannot accept what a run would refuse. A both-sides knob (the
speculative config, rendered on prefill and decode alike) is one value in a station, so it is checked once.
"""
from __future__ import annotations

from typing import Any

from core.knobs import KnobError, catalog, drafts_nothing


def refusal(knobs: dict[str, Any], engine: str | None) -> str | None:
    """The catalog's reason for refusing this station ("knob: reason"), or None when it accepts it."""
    try:
        catalog().validate(dict(knobs), engine=engine)
    except KnobError as e:
        return str(e)
    why = drafts_nothing(catalog().defaults(engine or "sim") | dict(knobs))
    return None if why is None else str(why)


def accepted(knobs: dict[str, Any], engine: str | None) -> bool:
    """Whether a run of this station could be deployed at all (the catalog accepts every value and dependency)."""
    return refusal(knobs, engine) is None
