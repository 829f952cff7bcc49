"""The evidence's typed parts (core/evidence_parts.py) read records as stored and write them back unchanged: a run
recorded before the parts were typed loads, its readers read attributes, and its dump is the dict it was."""
from __future__ import annotations

import json

import pytest

from core.evidence import Evidence
from core.evidence_parts import Breakdown, Drift, ExpertLoad, ProfileSummary, profile_of
from core.ledger import drift_line

SIM_BREAKDOWN = {"prefill": {"instances": 2.0, "elapsed_s": 10.0, "compute_s": 12.0, "communication_s": 1.0,
                             "scheduling_s": 2.0, "imbalance_s": 0.0, "draft_s": 0.0, "idle_s": 5.0,
                             "busy_share": 0.75},
                 "decode": {"instances": 1.0, "elapsed_s": 10.0, "compute_s": 5.0, "communication_s": 0.5,
                            "scheduling_s": 1.0, "imbalance_s": 2.0, "draft_s": 1.5, "idle_s": 0.0, "busy_share": 1.0}}
CAPTURE = {"files": 2, "devices": 8, "window_s": 4.5, "seconds": {"compute": 20.0, "communication": 3.0,
                                                                  "scheduling": 1.0, "idle": 12.0},
           "share": {"compute": 0.55, "communication": 0.08, "scheduling": 0.03, "idle": 0.33},
           "top_kernels": [{"name": "fused_moe_kernel", "seconds": 9.5}, {"name": "ncclAllReduce", "seconds": 2.5}],
           "method": "device-time union per device; exposed communication; host-busy gaps = scheduling"}
DRIFT = {"profile": "examples/cal.yaml", "threshold": 0.15,
         "predicted": {"output_tok_s": 130.0, "tpot_mean_ms": 21.0}, "measured": {"output_tok_s": 100.0,
                                                                                 "tpot_mean_ms": 30.0},
         "drift": {"output_tok_s": 0.3, "tpot_mean_ms": -0.3}, "worst": 0.3, "flagged": True,
         "knobs_not_modelled": ["enable_chunked_prefill"],
         "suggestion": "the simulator's prediction is off by 30% (limit 15%): re-calibrate, e.g. tuneloop sim "
                       "calibrate runs/r1 --base examples/cal.yaml --out PROFILE.yaml"}
DRIFT_ERROR = {"profile": "examples/cal.yaml", "threshold": 0.15, "error": "KeyError: 'scenario'", "flagged": True,
               "suggestion": "the calibrated profile cannot predict this station: re-calibrate"}
EXPERT = {"decode": {"per_rank": [0.3, 0.2, 0.25, 0.25], "max_over_mean": 1.2, "worst_instance": "decode-0",
                     "per_instance": {"decode-0": 1.2, "decode-1": 1.1}}}
EXPERT_OLD = {"decode": {"per_rank": [0.5, 0.5], "max_over_mean": 1.0}}  # the record's first shape
LEGACY = {"decode": {"imbalance": {"share": 0.2}, "compute_s": "n/a"}, "note": "captured by hand"}


def stored(**parts) -> dict:
    """An evidence record as the store holds it (every field explicit), with the given parts."""
    return json.loads(Evidence().model_dump_json()) | parts


@pytest.mark.parametrize("parts", [
    {"breakdown": SIM_BREAKDOWN, "profile": SIM_BREAKDOWN, "expert_load": EXPERT, "drift": DRIFT},
    {"breakdown": {}, "profile": CAPTURE, "drift": DRIFT_ERROR, "expert_load": EXPERT_OLD},
    {"breakdown": LEGACY, "profile": {"files": 0, "error": "no trace files under /tmp/p since 0.000"}},
])
def test_a_stored_record_validates_and_dumps_back_equal(parts):
    rec = stored(**parts)
    ev = Evidence.model_validate_json(json.dumps(rec))
    assert json.loads(ev.model_dump_json()) == rec
    assert ev.model_dump(mode="json") == rec
    assert Evidence.model_validate(ev.model_dump()) == ev


def test_the_parts_are_typed_and_read_as_attributes():
    ev = Evidence.model_validate(stored(breakdown=SIM_BREAKDOWN, profile=CAPTURE, expert_load=EXPERT, drift=DRIFT))
    assert isinstance(ev.breakdown, Breakdown) and isinstance(ev.profile, ProfileSummary)
    assert isinstance(ev.drift, Drift) and isinstance(ev.expert_load["decode"], ExpertLoad)
    dec = ev.breakdown.role("decode")
    assert dec is not None and dec.busy_share == 1.0 and dec.seconds("imbalance_s") == 2.0
    assert dec.accounted_s == 5.0 + 0.5 + 1.0 + 2.0 + 1.5  # every *_s but elapsed and idle
    assert ev.breakdown.role("mixed") is None and set(ev.breakdown.roles()) == {"prefill", "decode"}
    assert ev.expert_load["decode"].max_over_mean == 1.2 and ev.profile.top_kernels[0].name == "fused_moe_kernel"
    assert ev.drift.measured.tpot_mean_ms == 30.0 and ev.drift.flagged
    # a simulator's profile step brings its breakdown back: typed as one
    assert isinstance(profile_of(SIM_BREAKDOWN), Breakdown) and profile_of(None) is None


def test_a_legacy_breakdown_reads_what_is_a_number():
    ev = Evidence.model_validate(stored(breakdown=LEGACY))
    dec = ev.breakdown.role("decode")
    assert dec is not None and dec.seconds("compute_s") is None and dec.accounted_s == 0.0
    assert ev.breakdown.role("note") is None and set(ev.breakdown.roles()) == {"decode"}


def test_drift_line_words_are_unchanged():
    assert drift_line(Drift.model_validate(DRIFT)) == (
        "DRIFT: simulator (examples/cal.yaml) predicted 130.0 tok/s, TPOT 21.0 ms; measured 100.0 tok/s, TPOT 30.0 ms "
        "(drift +30% / -30%, limit 15%) — " + DRIFT["suggestion"])
    assert drift_line(Drift.model_validate(DRIFT | {"flagged": False})).startswith("drift within limit: simulator")
    assert drift_line(Drift.model_validate(DRIFT_ERROR)) == (
        "DRIFT: KeyError: 'scenario' — the calibrated profile cannot predict this station: re-calibrate")
    assert drift_line(None) is None
