"""A draft method with a draft width of 0 is refused at every entry (issue 55): vLLM's SpeculativeConfig has
num_speculative_tokens gt=0 (vllm/config/speculative.py), so such a station would not start; SGLang would run no
draft. A goal's start station and the twin's searches refused it already; the card checks and the station the
executor deploys (`core.station.full_knobs`) refuse it too. The width's catalog minimum stays 0, its default (the
width of a station with no draft method): a minimum of 1 would refuse every full station without MTP.
"""
from __future__ import annotations

import pytest
from planner_support import GOAL16, baseline, history, outcome, screen, summary

from agent.planner.checks import check
from agent.planner.refusals import RefusalKind
from core.knobs import KnobError, catalog
from core.station import full_knobs


def test_a_draft_method_of_width_0_is_refused_by_the_card_checks_and_full_knobs():
    h = history([outcome(baseline(), summary(), "reference")])
    assert GOAL16.start_station()["speculative_method"] == "mtp" and 0 in GOAL16.space()["num_speculative_tokens"]
    assert check(screen("num_speculative_tokens", 1), h) == []
    refused = [r for r in check(screen("num_speculative_tokens", 0), h) if r.kind is RefusalKind.DEPENDENCIES]
    assert refused and "num_speculative_tokens 0 drafts nothing" in refused[0].words, refused
    for engine in ("vllm", "sglang", "sim"):
        with pytest.raises(KnobError, match="speculative_method: mtp with num_speculative_tokens 0 drafts nothing"):
            full_knobs({"speculative_method": "mtp", "num_speculative_tokens": 0}, engine)
    none = full_knobs({"speculative_method": "none", "num_speculative_tokens": 0}, "vllm")  # no draft: width 0 is fine
    assert none["num_speculative_tokens"] == 0


def test_the_catalog_minimum_stays_0_because_a_station_without_a_draft_has_width_0():
    knob = catalog().get("num_speculative_tokens")
    assert (knob.min, knob.default) == (0, 0)
    raised = knob.model_copy(update={"min": 1.0})  # what a minimum of 1 would do to every station without MTP
    with pytest.raises(KnobError, match="num_speculative_tokens: 0 is below the minimum 1"):
        raised.coerce(full_knobs({}, "vllm")["num_speculative_tokens"])
