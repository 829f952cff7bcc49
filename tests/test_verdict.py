"""Every verdict and every reason code, on hand-built records; plus re-runnable collection."""
import json

import pytest

from core import records as rec
from core.records import RequestRecord, RunInfo
from core.summary import Contract
from executor.collect import STATS_FAULT, CollectionError, collect, contract_for, summarize_run
from executor.exports import requests_csv, vllm_result
from executor.verdict import judge


def info(n=4, warmup=0, cards=2, **kw):
    return RunInfo(scenario="copy16k-zero-cache", scenario_version=1, n=n, warmup=warmup, concurrency=2,
                   request_rate=1.0, cards=cards, output_len=3, **kw)


def rec_(i, ok=True, n_out=3, n_in=100, n_cached=None, sent=True, warmup=False):
    return RequestRecord(id=i, warmup=warmup, t_sched=float(i), t_send=float(i) if sent else None,
                         chunk_times=[i + 0.1, i + 0.2, i + 0.3] if ok else [], n_in=n_in, n_cached=n_cached,
                         n_out=n_out if ok else None, n_out_expected=3, ok=ok, error=None if ok else "HTTP 500")


C = Contract(output_len=3)


def test_valid():
    v = judge([rec_(i) for i in range(4)], info(), C)
    assert v.kind == "valid" and v.valid and v.reasons == []


def test_warmup_records_do_not_count():
    recs = [rec_(0, warmup=True, ok=False)] + [rec_(i) for i in range(1, 5)]
    assert judge(recs, info(warmup=1), C).kind == "valid"


def test_orchestration_fault_when_formal_never_sent():
    v = judge([rec_(0, warmup=True)], info(n=4, warmup=1), C)
    assert v.kind == "orchestration_fault" and v.reasons[0].code == "formal_not_sent" and v.reasons[0].count == 4
    v2 = judge([rec_(0), rec_(1), rec_(2, sent=False)], info(n=4), C)
    assert v2.kind == "orchestration_fault" and v2.reasons[0].request_ids == [2, 3]


def test_collection_fault_when_statistics_failed():
    v = judge([rec_(i) for i in range(4)], info(), C, summary_error="disk full")
    assert v.kind == "collection_fault" and v.reasons[0].code == "statistics_failed"
    assert "disk full" in v.reasons[0].message and "re-summarise" in v.reasons[0].message


@pytest.mark.parametrize("recs,contract,code,ids", [
    ([rec_(0), rec_(1, ok=False), rec_(2), rec_(3)], C, "failed_requests", [1]),
    ([rec_(0), rec_(1, n_out=2), rec_(2, n_out=1), rec_(3)], C, "short_output", [1, 2]),
    ([rec_(0), rec_(1), rec_(2), rec_(3, n_out=4)], C, "long_output", [3]),
    ([rec_(0), rec_(1, n_out=None), rec_(2), rec_(3)], C, "output_len_unknown", [1]),
    ([rec_(0, n_cached=64), rec_(1, n_cached=0), rec_(2), rec_(3)], Contract(output_len=3, zero_cache=True),
     "unexpected_cache_hit", [0]),
    ([rec_(0, n_cached=90), rec_(1, n_cached=80), rec_(2, n_cached=95), rec_(3, n_cached=91)],
     Contract(output_len=3, min_request_hit=0.85), "cache_hit_below", [1]),
    ([rec_(0, n_cached=90), rec_(1), rec_(2, n_cached=95), rec_(3, n_cached=91)],
     Contract(output_len=3, min_request_hit=0.85), "cache_hit_unknown", [1]),
])
def test_contract_violations_name_the_requests(recs, contract, code, ids):
    v = judge(recs, info(), contract)
    assert v.kind == "contract_violation"
    r = next(r for r in v.reasons if r.code == code)
    assert r.request_ids == ids and r.count == len(ids) and str(ids[0]) in r.message


def test_failures_allowed_when_contract_says_so():
    assert judge([rec_(0), rec_(1, ok=False), rec_(2), rec_(3)], info(), Contract(output_len=3, all_succeed=False)).valid


def test_cards_missing():
    recs = [rec_(i) for i in range(4)]
    v = judge(recs, info(cards=2), Contract(output_len=3, cards_required=16))
    assert v.kind == "contract_violation" and v.reasons[0].code == "cards_missing" and v.reasons[0].count == 14
    assert judge(recs, info(cards=2), Contract(output_len=3, cards_required=16), n_cards=16).valid


def write_run(tmp_path, recs, inf=None):
    inf = inf or info()
    (tmp_path / rec.RUN_INFO).write_text(inf.model_dump_json())
    rec.write_records(tmp_path / rec.REQUESTS, recs)
    return tmp_path


def test_summarize_run_is_rerunnable_and_stats_fault_marker_fails_once(tmp_path):
    d = write_run(tmp_path, [rec_(i) for i in range(4)])
    (d / STATS_FAULT).write_text("")
    with pytest.raises(CollectionError):
        summarize_run(d)
    assert not (d / STATS_FAULT).exists()
    s1, v1 = summarize_run(d)
    s2, v2 = summarize_run(d)
    assert s1 == s2 and v1.valid and s1.n_ok == 4
    assert json.loads((d / "verdict.json").read_text())["kind"] == "valid" and (d / rec.SUMMARY).exists()


def test_collect_turns_stats_failure_into_collection_fault(tmp_path):
    d = write_run(tmp_path, [rec_(i) for i in range(4)])
    (d / STATS_FAULT).write_text("")
    s, v = collect(d)
    assert s is None and v.kind == "collection_fault"
    s, v = collect(d)
    assert s is not None and v.valid


def test_contract_from_scenario_file():
    c = contract_for(info())
    assert c.zero_cache and c.output_len == 3 and c.min_request_hit is None
    c2 = contract_for(RunInfo(scenario="copy128k-prefix90", scenario_version=1, n=1, concurrency=1,
                              request_rate=1, output_len=1024))
    assert not c2.zero_cache and c2.min_request_hit == 0.85


def test_exports(tmp_path):
    recs = [rec_(i) for i in range(4)]
    res = vllm_result(recs, info())
    assert res["completed"] == 4 and res["total_output_tokens"] == 12 and res["max_concurrency"] == 2
    assert res["mean_ttft_ms"] == pytest.approx(100) and res["mean_tpot_ms"] == pytest.approx(100)
    assert res["duration"] == pytest.approx(3.3) and len(res["itls"]) == 4
    csv = requests_csv(recs).splitlines()
    assert csv[0].startswith("id,warmup,ok") and len(csv) == 5 and ",100.0" in csv[1]


def test_a_failed_kv_hand_off_is_an_orchestration_fault_never_a_result():
    from core.evidence import Evidence
    from executor.verdict import handoff_fault

    assert handoff_fault(None) is None and handoff_fault(Evidence.model_validate({"kv_transfer": None})) is None
    assert handoff_fault(Evidence.model_validate({"kv_transfer": {"failed": 0.0}})) is None
    v = handoff_fault(Evidence.model_validate({"kv_transfer": {"failed": 3.0, "kv_failed_transfers": 2.0,
                                                               "kv_late_reads": 1.0, "kv_expired": 1.0}}))
    assert v.kind == "orchestration_fault" and [r.code for r in v.reasons] == ["kv_handoff_failed"]
    assert v.reasons[0].count == 3 and "failed transfers 2, late reads 1, expired 1" in v.reasons[0].message


def test_a_read_after_the_lease_expired_fails_the_hand_off_an_expiry_alone_does_not():
    """Prefill counts leases that expired and reads that completed after; decode counts failed transfers: the
    digest sums both roles' figures, differenced over the run per instance. An expiry alone is decode pulling late
    (vLLM counts it apart from transport health); a read after it may have read reused blocks."""
    from core.evidence import Evidence
    from core.records import EngineSample
    from executor.evidence_kv import kv_transfer
    from executor.verdict import handoff_fault

    def at(t: float, role: str, values: dict) -> EngineSample:
        return EngineSample(t=t, role=role, instance=f"{role}-0", values=values)

    expired = "vllm:nixl_num_kv_expired_reqs_total{engine=\"0\"}"
    late = "vllm:nixl_num_notifications_after_expiry_total{engine=\"0\"}"
    remote = 'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}'
    decode = [at(0, "decode", {remote: 100.0, "vllm:nixl_num_failed_transfers_total": 0.0}),
              at(1, "decode", {remote: 400.0, "vllm:nixl_num_failed_transfers_total": 0.0})]
    kv = kv_transfer([at(0, "prefill", {expired: 2.0, late: 0.0}), at(1, "prefill", {expired: 9.0, late: 0.0}),
                      *decode])
    assert kv["kv_tokens_remote"] == 300.0 and kv["kv_expired"] == 7.0 and kv["failed"] == 0.0
    # decode pulled late, but before the blocks were released
    assert handoff_fault(Evidence.model_validate({"kv_transfer": kv})) is None
    kv = kv_transfer([at(0, "prefill", {expired: 2.0, late: 1.0}), at(1, "prefill", {expired: 3.0, late: 2.0}),
                      *decode])
    assert kv["kv_late_reads"] == 1.0 and kv["failed"] == 1.0
    assert handoff_fault(Evidence.model_validate({"kv_transfer": kv})).reasons[0].message.startswith(
        "the KV hand-off from prefill to decode failed (late reads 1, expired 1)")


def test_a_warm_up_hand_off_that_timed_out_is_the_warm_ups_a_measured_one_is_a_fault(tmp_path):
    """The first hand-off of a fresh pair opens NIXL's side channel (vLLM waits 5 s for its handshake): on busy
    cores a warm-up request can time out there (CI: warm-up request 0 failed, the failure scraped at 56 s, the first
    measured request sent at 65 s, all 16 measured requests handed over). Failures scraped before the first
    measured send are the warm-up's, named apart; one scraped after it fails the run, whenever it began."""
    from core import records as rec
    from core.evidence import Evidence
    from core.records import EngineSample, RequestRecord
    from executor.evidence import digest_run
    from executor.verdict import handoff_fault

    failed = "vllm:nixl_num_failed_transfers_total{engine=\"0\"}"
    remote = 'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}'

    def run(fail_scraped_at: float):
        d = tmp_path / f"at{fail_scraped_at}"
        d.mkdir()
        scrapes = [(0.3, 0.0, 0.0), (fail_scraped_at, 1.0, 100.0), (70.0, 1.0, 900.0), (120.0, 1.0, 1800.0)]
        (d / rec.METRICS).write_text("".join(EngineSample(
            t=t, role="decode", instance="decode-0", values={failed: f, remote: r}).model_dump_json() + "\n"
            for t, f, r in sorted(scrapes)))
        reqs = [RequestRecord(id=0, warmup=True, t_sched=0.2, t_send=0.2, n_out_expected=32, http_status=500,
                              error="stream error"),
                RequestRecord(id=1, warmup=True, t_sched=0.2, t_send=0.2, n_out_expected=32, chunk_times=[64.0],
                              chunk_tokens=[1]),
                *(RequestRecord(id=i, t_sched=65.0, t_send=65.0 + i / 10, n_out_expected=32, chunk_times=[100.0],
                                chunk_tokens=[1])
                  for i in range(2, 6))]
        (d / rec.REQUESTS).write_text("".join(r.model_dump_json() + "\n" for r in reqs))
        return digest_run(d).kv_transfer

    kv = run(56.0)
    assert kv.failed == 0.0 and kv.warmup_failed == 1.0 and kv.kv_failed_transfers == 0.0
    assert kv.kv_tokens_remote == 1800.0  # the hand-off's volume is the whole run's, warm-up included
    assert handoff_fault(Evidence(kv_transfer=kv)) is None
    kv = run(66.0)  # scraped after the first measured send: the measured requests' failure
    assert kv.failed == 1.0 and kv.warmup_failed == 0.0
    assert handoff_fault(Evidence(kv_transfer=kv)).reasons[0].code == "kv_handoff_failed"
