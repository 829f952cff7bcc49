"""The KV-transfer rule reads the transfer evidence (the decode side's hand-over queue), on real simulator runs:
where most of the decode side's requests wait for their KV, the value model puts more decode instances (more
links, as many as the prefill side's spare time can feed) first, values fewer idle prefill instances, and damps more in flight; where the hand-over queue is empty,
it leaves the moves alone."""
from __future__ import annotations

from agent.planner.deterministic import candidates, diagnosis_for
from tests.rules_support import measured_start

KV = "llama31-70b-h100-kv-transfer-bound"  # 32K prompts, KV over TCP, one transfer per decode link
FLAT = "llama31-8b-910b-flat"


def _values(h):
    return {(c.change.knob, c.change.new): v for c, v in candidates(h, diagnosis_for(h)) if c.also is None}


def test_the_transfer_bound_is_seen_in_the_hand_over_queue_and_values_the_links(tmp_path):
    h = measured_start(tmp_path, KV)
    d = diagnosis_for(h)
    assert d.transfer_wait is not None and d.transfer_wait > 0.8
    hyp = d.get("kv_transfer")
    assert hyp.status == "supported" and any("wait for their KV transfer" in e for e in hyp.evidence_for)
    v = _values(h)
    ranked = sorted(v, key=lambda k: -v[k].value)
    # prefill is ~45 % busy: it can feed about twice the rate, so the decode side is sized to 4 links at once
    assert ranked[0] == ("num_decode_instances", 4), [(k, v[k].value) for k in ranked]
    assert "4 decode instances receive +100% more KV" in v[("num_decode_instances", 4)].why
    assert "the evidence sizes a jump to 4 instead" in v[("num_decode_instances", 3)].why
    assert v[("num_prefill_instances", 3)].value > v[("num_prefill_instances", 5)].value
    assert "more in flight queues at the link" in v[("concurrency", 64)].why


def test_without_a_hand_over_queue_the_transfer_rule_changes_nothing(tmp_path):
    h = measured_start(tmp_path, FLAT)
    d = diagnosis_for(h)
    assert d.get("kv_transfer").status == "weak"
    assert not any("KV transfer binds" in v.why or "at the link" in v.why for v in _values(h).values())
