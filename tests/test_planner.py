"""The pure planner parts: diagnosis, cards, checks, value ordering, judgement, deterministic ask()."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.candidates import build_card, station_hash, with_stage
from agent.checks import check, retry_note
from agent.diagnosis import diagnose
from agent.history import Figures, History, Negative, Outcome
from agent.judgement import compare, decide, frontier
from agent.planner import DeterministicPlanner
from executor.summary import Dist, Summary, WindowFigures
from state.goal import load_goal

ROOT = Path(__file__).resolve().parents[1]
GOAL16 = load_goal(ROOT / "examples" / "goal-16k.yaml")

PREFILL_BOUND = {  # the field report's cap-1 picture: P queue always busy, D starved
    "prefill_waiting_mean": 40.0, "prefill_waiting_nonzero_share": 0.95, "decode_waiting_mean": 0.0,
    "decode_waiting_nonzero_share": 0.0, "decode_running_mean": 60.0, "decode_running_max": 80.0,
    "decode_batch_limit": 256.0, "kv_usage_max": 0.4, "spec_accept_length": None, "prefill_batch_reqs_mean": 1.0,
    "prefill_batch_tokens_mean": 5400.0, "prefill_tail_batch_share": 0.33, "breakdown": {}, "samples": 120}
DECODE_BOUND = PREFILL_BOUND | {"prefill_waiting_mean": 0.1, "prefill_waiting_nonzero_share": 0.05,
                                "decode_waiting_mean": 12.0, "decode_waiting_nonzero_share": 0.8,
                                "decode_running_max": 256.0, "prefill_tail_batch_share": 0.0}


def window(kind: str, tok: float, dur: float = 100.0, conc: float = 120.0) -> WindowFigures:
    return WindowFigures(kind=kind, start=0.0, end=dur, duration=dur, n_requests=300, output_tokens=tok * dur * 16,
                         output_tok_s=tok * 16, output_tok_s_per_card=tok, qps=2.0, achieved_concurrency=conc)


def summary(n: int = 320, whole: float = 180.0, native: float | None = None, tpot: float = 9.0,
            ttft: float = 900.0, e2e: float = 10000.0, conc: float = 120.0) -> Summary:
    d = lambda m: Dist(n=n, mean=m, p50=m, p90=m * 1.2, p99=m * 1.5)  # noqa: E731
    return Summary(n_total=n, n_formal=n, n_sent=n, n_ok=n, n_failed=0, cards=16, concurrency=128, request_rate=6.0,
                   whole=window("whole", whole, conc=conc), native=window("native", native) if native else None,
                   ttft_ms=d(ttft), tpot_ms=d(tpot), itl_ms=d(tpot), e2e_ms=d(e2e), queue_delay_ms=d(1.0),
                   output_len_min=1024, output_len_max=1024)


def outcome(card, s: Summary, decision: str, evidence=None) -> Outcome:
    return Outcome(card=card, verdict="valid", decision=decision,
                   figures=Figures.of(s, "output_tok_s_per_card", GOAL16.constraints.violations(s)),
                   summary=s, evidence=evidence or PREFILL_BOUND, run_id=card.run_id())


def history(outcomes=(), negatives=(), best=None, budget=24.0, experiments=8) -> History:
    best = best or GOAL16.start_station()
    return History(goal_id="g1", goal=GOAL16, data_version="dv1", best_knobs=best, warm_knobs=best,
                   outcomes=list(outcomes), negatives=list(negatives), budget_left_card_hours=budget,
                   experiments_left=experiments)


def baseline(knobs=None, n=320):
    return build_card("g1", GOAL16.scenario, knobs or GOAL16.start_station(), None, None, stage="baseline", n=n)


def screen(knob, new, parent=None):
    return build_card("g1", GOAL16.scenario, parent or GOAL16.start_station(), knob, new, stage="screen", n=320)


# -- diagnosis -----------------------------------------------------------------------------------------
def test_prefill_supply_named_from_queue_evidence():
    d = diagnose(summary(), PREFILL_BOUND, 20.0, GOAL16.start_station())
    assert d.leading.name == "prefill_supply" and d.leading.status == "supported"
    assert any("decode waiting near zero" in e for e in d.get("prefill_supply").evidence_for)
    assert d.get("decode_capacity").status == "weak"
    assert not d.propose_profile


def test_decode_capacity_named_when_decode_at_its_limit_with_waiting():
    d = diagnose(summary(), DECODE_BOUND, 20.0, {})
    assert d.leading.name == "decode_capacity"
    assert d.get("prefill_supply").evidence_against


def test_client_supply_when_achieved_concurrency_far_below_c():
    ev = PREFILL_BOUND | {"prefill_waiting_nonzero_share": 0.0, "prefill_waiting_mean": 0.0}
    d = diagnose(summary(conc=30.0), ev, 20.0, {})
    assert d.leading.name == "client_supply"


def test_latency_bound_and_profile_only_when_queues_cannot_separate():
    d = diagnose(summary(tpot=19.5), PREFILL_BOUND, 20.0, {})
    assert d.get("latency_bound").status == "supported"
    d2 = diagnose(summary(), {"kv_usage_max": 0.99}, 20.0, {})  # no queue series: nothing separates them
    assert d2.propose_profile and d2.profile_reason


def test_expert_imbalance_from_breakdown_only():
    ev = DECODE_BOUND | {"breakdown": {"decode": {"compute_s": 60.0, "imbalance_s": 30.0}}}
    assert diagnose(summary(), ev, 20.0, {}).get("expert_imbalance").status != "weak"
    assert diagnose(summary(), DECODE_BOUND, 20.0, {}).get("expert_imbalance").status == "weak"


# -- cards and checks ----------------------------------------------------------------------------------
def test_card_hashes_name_the_experiment_and_the_shown_content():
    a, b = screen("max_prefill_reqs", 2), screen("max_prefill_reqs", 2)
    assert a.content_hash == b.content_hash and a.experiment_key == b.experiment_key
    c = a.model_copy(update={"mechanism": "other words"})
    assert c.content_hash != a.content_hash and c.experiment_key == a.experiment_key
    assert with_stage(a, "confirm", 640).experiment_key != a.experiment_key
    assert a.knobs["max_prefill_reqs"] == 2 and a.parent_knobs["max_prefill_reqs"] == 1


def test_checks_refuse_bad_proposals_with_reasons():
    h = history([outcome(baseline(), summary(), "reference")])
    assert check(screen("max_prefill_reqs", 2), h) == []
    two = screen("max_prefill_reqs", 2).model_copy(update={"parent_knobs": GOAL16.start_station() | {"concurrency": 90}})
    assert any(r.startswith("parent") for r in check(two, h))
    assert any(r.startswith("in_range") for r in check(screen("max_prefill_reqs", 3), h))
    assert any(r.startswith("in_range") for r in check(screen("long_prefill_token_threshold", 64), h))
    # a draft width needs a speculative method first: from a station without MTP the width is refused
    no_mtp = GOAL16.start_station() | {"speculative_method": "none", "num_speculative_tokens": 0}
    h_no_mtp = history([outcome(baseline(no_mtp), summary(), "reference")], best=no_mtp)
    dep = screen("num_speculative_tokens", 2, parent=no_mtp)
    assert any(r.startswith("dependencies") for r in check(dep, h_no_mtp))
    neg = Negative(knob="max_prefill_reqs", value=2, scenario=GOAL16.scenario, data_version="dv1",
                   parent_station=station_hash(GOAL16.start_station()), source_identity="sim", experiment_key="x")
    assert any(r.startswith("known_negative") for r in check(screen("max_prefill_reqs", 2), history(
        [outcome(baseline(), summary(), "reference")], negatives=[neg])))
    assert any(r.startswith("affordable") for r in check(screen("max_prefill_reqs", 2), history(
        [outcome(baseline(), summary(), "reference")], budget=0.01)))
    assert any(r.startswith("not_finished") for r in check(baseline(), h))


def test_negative_may_be_retried_when_conditions_changed_saying_which():
    best = GOAL16.start_station() | {"max_prefill_reqs": 2}
    neg = Negative(knob="max_num_batched_tokens", value=16384, scenario=GOAL16.scenario, data_version="dv1",
                   parent_station=station_hash(GOAL16.start_station()), source_identity="sim", experiment_key="x")
    h = history([outcome(baseline(best), summary(), "reference")], negatives=[neg], best=best)
    card = screen("max_num_batched_tokens", 16384, parent=best)
    assert check(card, h) == []
    assert "parent station changed" in (retry_note(card, h) or "")


# -- judgement -----------------------------------------------------------------------------------------
def test_compare_refuses_different_n_and_never_mixes_windows():
    with pytest.raises(ValueError):
        compare(Figures(n=320, whole=1.0), Figures(n=640, whole=1.0), "native")
    c = compare(Figures(n=640, whole=110.0, native=None), Figures(n=640, whole=100.0, native=120.0), "native")
    assert c.window == "whole" and c.gain == pytest.approx(0.10)


def test_screen_confirm_tradeoff_and_quality_pending():
    h = history([outcome(baseline(), summary(whole=180.0), "reference"),
                 outcome(baseline(n=640), summary(n=640, whole=185.0), "reference")])
    up = screen("max_prefill_reqs", 2)
    f = lambda s: Figures.of(s, "output_tok_s_per_card", GOAL16.constraints.violations(s))  # noqa: E731
    assert decide(up, "valid", f(summary(whole=230.0)), h)[0] == "promising"
    assert decide(up, "valid", f(summary(whole=181.0)), h)[0] == "negative"
    assert decide(up, "valid", f(summary(whole=250.0, tpot=21.0)), h)[0] == "negative"  # SLO broken
    assert decide(up, "collection_fault", None, h)[0] == "fault"
    assert decide(up, "contract_violation", None, h)[0] == "invalid"
    conf = with_stage(up, "confirm", 640)
    assert decide(conf, "valid", f(summary(n=640, whole=240.0)), h)[0] == "new_best"
    slower = f(summary(n=640, whole=176.0, tpot=8.0, ttft=500.0, e2e=8000.0))
    assert decide(with_stage(screen("concurrency", 90), "confirm", 640), "valid", slower, h)[0] == "tradeoff"
    risky = with_stage(screen("index_cache_reuse", True), "confirm", 640)
    assert risky.quality_risk
    assert decide(risky, "valid", f(summary(n=640, whole=240.0)), h)[0] == "quality_pending"


def test_frontier_keeps_whole_and_native_apart_and_native_empty_when_invalid():
    c128 = baseline(GOAL16.start_station(), n=640)
    c90 = with_stage(screen("concurrency", 90), "confirm", 640)
    rows = frontier([outcome(c128, summary(n=640, whole=240.0, native=None, ttft=3000.0, tpot=12.0, e2e=15000.0), "reference"),
                     outcome(c90, summary(n=640, whole=228.0, native=244.9, ttft=2000.0, tpot=10.0, e2e=12000.0), "tradeoff")], 640)
    assert [r["whole"] for r in rows] == [240.0, 228.0]
    assert rows[0]["native"] is None and rows[1]["native"] == 244.9


# -- deterministic planner -----------------------------------------------------------------------------
def test_planner_measures_the_start_then_proposes_the_prefill_cap_first():
    p = DeterministicPlanner()
    first = p.ask(history())
    assert first.card is not None and first.card.stage == "baseline"
    h = history([outcome(first.card, summary(), "reference")])
    plan = p.ask(h)
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.old, plan.card.change.new) == ("max_prefill_reqs", 1, 2)
    assert plan.diagnosis is not None and plan.diagnosis.leading.name == "prefill_supply"


def test_planner_confirms_promising_screen_with_a_parent_reference_at_confirm_n():
    p = DeterministicPlanner()
    up = screen("max_prefill_reqs", 2)
    h = history([outcome(baseline(), summary(), "reference"), outcome(up, summary(whole=230.0), "promising")])
    nxt = p.ask(h).card
    assert nxt is not None and nxt.stage == "baseline" and nxt.n == 640 and nxt.station == up.parent_station
    h2 = history(h.outcomes + [outcome(nxt, summary(n=640), "reference")])
    conf = p.ask(h2).card
    assert conf is not None and conf.stage == "confirm" and conf.n == 640 and conf.change == up.change


def test_planner_stops_when_budget_or_value_runs_out():
    p = DeterministicPlanner()
    h = history([outcome(baseline(), summary(), "reference")], experiments=0)
    assert p.ask(h).card is None and "budget" in (p.ask(h).stop_reason or "")
    tiny = history([outcome(baseline(), summary(), "reference")], budget=0.001)
    plan = p.ask(tiny)
    assert plan.card is None and plan.stop_reason


def test_lower_latency_at_a_small_whole_cost_is_a_tradeoff_not_a_loss():
    # the simulator's 128K screen: C90 -2.2 % whole, TTFT and E2E far lower, TPOT only 4 % lower
    h = history([outcome(baseline(), summary(whole=244.3, ttft=6710.0, tpot=17.8, e2e=24900.0), "reference")])
    f = lambda s: Figures.of(s, "output_tok_s_per_card", GOAL16.constraints.violations(s))  # noqa: E731
    c90 = screen("concurrency", 90)
    d, why = decide(c90, "valid", f(summary(whole=239.0, ttft=2570.0, tpot=17.1, e2e=20100.0)), h)
    assert d == "promising" and "trade-off" in why
    # one latency mean higher: no trade-off, a clear loss
    d2, why2 = decide(c90, "valid", f(summary(whole=239.0, ttft=2570.0, tpot=18.0, e2e=20100.0)), h)
    assert d2 == "negative" and "clear loss" in why2
