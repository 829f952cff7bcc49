"""The pure planner parts: diagnosis, cards, checks, value ordering, judgement, deterministic ask()."""
from __future__ import annotations

import pytest
from planner_support import DECODE_BOUND, GOAL16, PREFILL_BOUND, TPOT20, baseline, history, outcome, screen, summary

from agent.planner.candidates import build_card, station_hash, with_stage
from agent.planner.checks import check, retry_note
from agent.planner.refusals import RefusalKind
from agent.planner.diagnosis import diagnose
from agent.planner.history import Figures, Negative
from agent.planner.judgement import compare, decide, frontier
from agent.planner.deterministic import DeterministicPlanner


def test_prefill_supply_named_from_queue_evidence():
    d = diagnose(summary(), PREFILL_BOUND, TPOT20, GOAL16.start_station())
    assert d.leading.name == "prefill_supply" and d.leading.status == "supported"
    assert any("decode waiting near zero" in e for e in d.get("prefill_supply").evidence_for)
    assert d.get("decode_capacity").status == "weak"
    assert not d.propose_profile


def test_decode_capacity_named_when_decode_at_its_limit_with_waiting():
    d = diagnose(summary(), DECODE_BOUND, TPOT20, {})
    assert d.leading.name == "decode_capacity"
    assert d.get("prefill_supply").evidence_against


def test_client_supply_when_achieved_concurrency_far_below_c():
    ev = PREFILL_BOUND | {"prefill_waiting_nonzero_share": 0.0, "prefill_waiting_mean": 0.0}
    d = diagnose(summary(conc=30.0), ev, TPOT20, {})
    assert d.leading.name == "client_supply"


def test_latency_bound_and_profile_only_when_queues_cannot_separate():
    d = diagnose(summary(tpot=19.5), PREFILL_BOUND, TPOT20, {})
    assert d.get("latency_bound").status == "supported"
    d2 = diagnose(summary(), {"decode_kv_usage_max": 0.99}, TPOT20, {})  # no queue series: nothing separates them
    assert d2.propose_profile and d2.profile_reason


def test_expert_imbalance_from_breakdown_only():
    ev = DECODE_BOUND | {"breakdown": {"decode": {"compute_s": 60.0, "imbalance_s": 30.0}}}
    assert diagnose(summary(), ev, TPOT20, {}).get("expert_imbalance").status != "weak"
    assert diagnose(summary(), DECODE_BOUND, TPOT20, {}).get("expert_imbalance").status == "weak"


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
    assert any(r.kind is RefusalKind.PARENT for r in check(two, h))
    assert any(r.kind is RefusalKind.IN_RANGE for r in check(screen("max_prefill_reqs", 3), h))
    assert any(r.kind is RefusalKind.IN_RANGE for r in check(screen("long_prefill_token_threshold", 64), h))
    # a draft width needs a speculative method first: from a station without MTP the width is refused
    no_mtp = GOAL16.start_station() | {"speculative_method": "none", "num_speculative_tokens": 0}
    h_no_mtp = history([outcome(baseline(no_mtp), summary(), "reference")], best=no_mtp)
    dep = screen("num_speculative_tokens", 2, parent=no_mtp)
    assert any(r.kind is RefusalKind.DEPENDENCIES for r in check(dep, h_no_mtp))
    neg = Negative(knob="max_prefill_reqs", value=2, scenario=GOAL16.scenario, data_version="dv1",
                   parent_knobs_hash=station_hash(GOAL16.start_station()), source_identity="sim", experiment_key="x")
    assert any(r.kind is RefusalKind.KNOWN_NEGATIVE for r in check(screen("max_prefill_reqs", 2), history(
        [outcome(baseline(), summary(), "reference")], negatives=[neg])))
    assert any(r.kind is RefusalKind.AFFORDABLE for r in check(screen("max_prefill_reqs", 2), history(
        [outcome(baseline(), summary(), "reference")], budget=0.01)))
    assert any(r.kind is RefusalKind.NOT_FINISHED for r in check(baseline(), h))


def test_negative_may_be_retried_when_conditions_changed_saying_which():
    best = GOAL16.start_station() | {"max_prefill_reqs": 2}
    neg = Negative(knob="max_num_batched_tokens", value=16384, scenario=GOAL16.scenario, data_version="dv1",
                   parent_knobs_hash=station_hash(GOAL16.start_station()), source_identity="sim", experiment_key="x")
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
                 outcome(baseline(n=640), summary(n=640, whole=185.0, native=190.0), "reference")])
    up = screen("max_prefill_reqs", 2)
    f = lambda s: Figures.of(s, "output_tok_s_per_card", GOAL16.constraints.violations(s))  # noqa: E731
    assert decide(up, "valid", f(summary(whole=230.0)), h)[0] == "promising"
    assert decide(up, "valid", f(summary(whole=179.0)), h)[0] == "negative"
    small, why = decide(up, "valid", f(summary(whole=181.0)), h)  # +0.6 %: inside screen noise, not a clear negative
    assert small == "promising" and "confirm" in why
    assert decide(up, "valid", f(summary(whole=250.0, tpot=21.0)), h)[0] == "negative"  # SLO broken
    assert decide(up, "collection_fault", None, h)[0] == "fault"
    assert decide(up, "contract_violation", None, h)[0] == "invalid"
    conf = with_stage(up, "confirm", 640)
    assert decide(conf, "valid", f(summary(n=640, whole=240.0, native=245.0)), h)[0] == "new_best"
    slower = f(summary(n=640, whole=176.0, tpot=8.0, ttft=500.0, e2e=8000.0))
    assert decide(with_stage(screen("concurrency", 90), "confirm", 640), "valid", slower, h)[0] == "tradeoff"
    risky = with_stage(screen("index_cache_reuse", True), "confirm", 640)
    assert risky.quality_risk
    assert decide(risky, "valid", f(summary(n=640, whole=240.0, native=245.0)), h)[0] == "quality_pending"


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
    # the start is measured at confirm N: a confirm compares with it, a screen gets its screen-N reference first
    assert first.card is not None and first.card.stage == "baseline" and first.card.n == 640
    h = history([outcome(first.card, summary(n=640, native=185.0), "reference")])
    plan = p.ask(h)
    if plan.card is not None and plan.card.change is None:  # the move is screened: its screen-N reference first
        assert plan.card.stage == "baseline" and plan.card.n == 320 and plan.card.knobs_hash == first.card.knobs_hash
        h = history(h.outcomes + [outcome(plan.card, summary(), "reference")])
        plan = p.ask(h)
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.old, plan.card.change.new) == ("max_prefill_reqs", 1, 2)
    assert plan.diagnosis is not None and plan.diagnosis.leading.name == "prefill_supply"


def test_prefill_batch_composition_says_which_limit_binds():
    """Cap 1 on 16K prompts: one request per batch with budget to spare (the cap binds); cap 2 at an 8192
    budget: batches full to the budget, 1.5 requests each (the budget binds, a cap of 4 adds nothing)."""
    start = GOAL16.start_station() | {"max_num_batched_tokens": 8192}
    d = diagnose(summary(), PREFILL_BOUND, TPOT20, start)
    assert d.prefill_limit == "request_cap" and "cap of 1" in d.prefill_limit_why
    full = PREFILL_BOUND | {"prefill_batch_reqs_mean": 1.5, "prefill_batch_tokens_mean": 8181.0,
                            "prefill_tail_batch_share": 0.0}
    d = diagnose(summary(), full, TPOT20, start | {"max_prefill_reqs": 2})
    assert d.prefill_limit == "token_budget" and "8192-token budget" in d.prefill_limit_why
    assert diagnose(summary(), full | {"prefill_batch_tokens_mean": 6000.0, "prefill_batch_reqs_mean": 1.2}, TPOT20,
                    start | {"max_prefill_reqs": 2}).prefill_limit is None  # neither full: the evidence does not say
    assert diagnose(summary(), full, TPOT20, {}).prefill_limit is None  # no budget known: nothing to compare with


def test_a_full_token_budget_puts_the_budget_before_a_higher_request_cap():
    """From cap 2 with batches full to the budget, the planner raises the budget, not the cap (the cap would
    add no tokens); with the cap binding instead, the cap comes first."""
    p = DeterministicPlanner()
    best = GOAL16.start_station() | {"max_prefill_reqs": 2, "max_num_batched_tokens": 8192}
    full = PREFILL_BOUND | {"prefill_batch_reqs_mean": 1.5, "prefill_batch_tokens_mean": 8181.0,
                            "prefill_tail_batch_share": 0.0}

    def ask(evidence):
        base = build_card("g1", GOAL16.scenario, best, None, None, stage="baseline", n=320)
        h = history([outcome(base, summary(), "reference", evidence)], best=best)
        h = h.model_copy(update={"outcomes": h.outcomes + [outcome(with_stage(base, "baseline", 640),
                                                                   summary(n=640, native=236.0), "reference", evidence)]})
        return p.ask(h)

    plan = ask(full)
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.new) == ("max_num_batched_tokens", 16384)
    cap_up = next(r for r in plan.ranked if "max_prefill_reqs 2 -> 4" in r.title)
    assert "a higher request cap cannot add tokens" in cap_up.why
    plan = ask(full | {"prefill_batch_reqs_mean": 2.0, "prefill_batch_tokens_mean": 5400.0})
    assert (plan.card.change.knob, plan.card.change.new) == ("max_prefill_reqs", 4)


def test_the_sender_limit_that_binds_decides_between_a_higher_c_and_a_higher_rate():
    """QPS ≈ r with a third of C in flight: the rate holds the load down, a higher C adds nothing (and the
    reverse when what is in flight ≈ C). The move at the other limit keeps a quarter of its confidence."""
    from agent.planner.deterministic import candidates, diagnosis_for

    rate_bound = summary(conc=40.0).model_copy(update={"request_rate": 2.1})  # qps 2.0 of r 2.1, 40 of C128
    d = diagnose(rate_bound, PREFILL_BOUND, TPOT20, {})
    assert d.client_limit == "arrival_rate" and "a higher C adds nothing" in d.client_limit_why
    c_bound = summary(conc=127.0)
    d = diagnose(c_bound, PREFILL_BOUND, TPOT20, {})
    assert d.client_limit == "client_cap" and "only queues at the sender" in d.client_limit_why
    assert diagnose(summary(conc=100.0), PREFILL_BOUND, TPOT20, {}).client_limit is None  # neither clearly
    # a finite run drains: 640 requests sent at r=24 over 26.7 s, the last done ~5 s later, so QPS 20.7 is what
    # r alone gives (640 / 31.67 s = 20.21); with 42 % of C in flight the rate still binds
    w = summary(conc=107.0, e2e=5000.0).whole.model_copy(update={"qps": 20.7, "n_requests": 640})
    drained = summary(conc=107.0, e2e=5000.0).model_copy(update={"request_rate": 24.0, "concurrency": 256, "whole": w})
    d = diagnose(drained, PREFILL_BOUND, TPOT20, {})
    assert d.client_limit == "arrival_rate" and "20.21 r gives over the run's drain" in d.client_limit_why
    starved = drained.model_copy(update={"whole": w.model_copy(update={"qps": 12.0})})  # the sender fell behind r
    assert diagnose(starved, PREFILL_BOUND, TPOT20, {}).client_limit is None

    goal = GOAL16.model_copy(update={"search_space": {"concurrency": [128, 192], "request_rate": [2.1, 4.0]}})
    best = GOAL16.start_station() | {"request_rate": 2.1}
    base = build_card("g1", GOAL16.scenario, best, None, None, stage="baseline", n=320)
    idle = PREFILL_BOUND | {"prefill_waiting_nonzero_share": 0.0, "prefill_waiting_mean": 0.0}
    for s_, favoured in ((rate_bound, "request_rate"), (c_bound, "concurrency")):
        h = history([outcome(base, s_, "reference", idle)], best=best).model_copy(update={"goal": goal})
        vals = {c.change.knob: v for c, v in candidates(h, diagnosis_for(h)) if c.change.new > c.change.old}
        other = "concurrency" if favoured == "request_rate" else "request_rate"
        assert vals[favoured].value > vals[other].value and "× 0.25" in vals[other].why


def test_a_whole_window_goal_never_spends_its_warm_start_on_a_latency_trade_off():
    """Objective in the whole window, no native window at C128: a lower C is a trade-off (it may win latency,
    it cannot win the objective), so the warm start is not spent on it; the evidence's move comes first."""
    goal = GOAL16.model_copy(update={"objective": GOAL16.objective.model_copy(update={"window": "whole"})})
    base = baseline()
    h = history([outcome(base, summary(), "reference"),
                 outcome(with_stage(base, "baseline", 640), summary(n=640), "reference")])
    h = h.model_copy(update={"goal": goal})
    plan = DeterministicPlanner().ask(h)
    assert plan.card is not None and plan.card.change is not None
    assert plan.card.change.knob == "max_prefill_reqs", plan.ranked
    c_down = next(r for r in plan.ranked if "concurrency 128 -> 90" in r.title)
    assert "confidence 0.5" not in c_down.why  # a missing native window lends it nothing here


def test_the_decode_queue_sizes_the_batch_limit_jump_and_the_one_step_stays_behind_it():
    """Decode at its limit of 32 with ~90 waiting: the limit goes where the demand is (128 of 32/64/128/256),
    not one step; the one step stays a candidate (ranked after) for when the jump fails the latency limit."""
    from agent.planner.deterministic import candidates, diagnosis_for

    goal = GOAL16.model_copy(update={"search_space": {"max_num_seqs": [32, 64, 128, 256]}})
    best = GOAL16.start_station() | {"max_num_seqs": 32}
    ev = DECODE_BOUND | {"decode_running_max": 32.0, "decode_running_mean": 31.0, "decode_batch_limit": 32.0,
                         "decode_waiting_mean": 90.0, "decode_instances": 1}
    base = build_card("g1", GOAL16.scenario, best, None, None, stage="baseline", n=320)
    h = history([outcome(base, summary(), "reference", ev)], best=best).model_copy(update={"goal": goal})
    diag = diagnosis_for(h)
    assert diag is not None and diag.decode_demand == pytest.approx(121.0)
    ranked = [(c.change.new, v.value) for c, v in candidates(h, diag) if c.change.knob == "max_num_seqs"]
    assert ranked[0][0] == 128 and 64 in [n for n, _ in ranked[1:]]
    assert dict(ranked)[64] < dict(ranked)[128]
    calm = ev | {"decode_waiting_mean": 20.0}  # demand 51: the next step is already enough, no jump
    h2 = h.model_copy(update={"outcomes": [outcome(base, summary(), "reference", calm)]})
    assert [c.change.new for c, _ in candidates(h2, diagnosis_for(h2)) if c.change.knob == "max_num_seqs"] == [64]


def test_planner_confirms_promising_screen_with_a_parent_reference_at_confirm_n():
    p = DeterministicPlanner()
    up = screen("max_prefill_reqs", 2)
    h = history([outcome(baseline(), summary(), "reference"), outcome(up, summary(whole=230.0), "promising")])
    nxt = p.ask(h).card
    assert nxt is not None and nxt.stage == "baseline" and nxt.n == 640 and nxt.knobs_hash == up.parent_knobs_hash
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


# -- planner efficiency (issue 9): objective window, load headroom, retries -------------------------------


def test_a_screen_runs_only_where_it_is_cheaper_than_the_confirm_alone():
    """The screen path (the screen-N reference where missing, shared by the plan's screens; the screen; then the
    confirm on the warm station times the chance the screen passes) against the confirm alone. A restart is paid
    once either way; a likely pass, or a reference still to be measured for this screen alone, sends the move
    straight to confirm N; an open hypothesis with its reference at hand is screened. The card says why."""
    from agent.planner.deterministic import _cheaper_direct
    from agent.planner.value import CostModel, Value

    ref640 = outcome(baseline(n=640), summary(n=640), "reference")
    ref320 = outcome(baseline(), summary(), "reference")
    move = screen("max_num_seqs", 128)  # a restart move
    rate = screen("request_rate", 12.0)  # a hot one
    assert move.cost_class == "restart" and rate.cost_class == "hot"
    v = Value(value=1.0, gain=0.1, confidence=0.3, rules_out=0.0, cost_card_hours=1.0, why="")
    sure = v.model_copy(update={"confidence": 0.9})
    cost = CostModel(cards=16, seconds={"restart": 600.0, "weight_load": 900.0, "warmup": 60.0}, load_s_per_request=0.5)
    h = history([ref640, ref320]).model_copy(update={"cost": cost})
    for card in (move, rate):
        assert _cheaper_direct(card, v, h, screens=4) is None  # open hypothesis, reference measured: screen it
        why = _cheaper_direct(card, sure, h, screens=4)  # it would pass anyway: the confirm alone is cheaper
        assert why is not None and why.startswith("the confirm alone (") and "0.90 x" in why
    # the screen-N reference still to be measured for this screen alone: the confirm alone is cheaper
    h1 = history([ref640]).model_copy(update={"cost": cost})
    assert "reference share" in (_cheaper_direct(rate, v, h1, screens=1) or "")
    assert _cheaper_direct(rate, v, h1, screens=8) is None  # eight screens share it: screen
    # no confirm-N run of the parent to compare a confirm with: screen first
    assert _cheaper_direct(rate, sure, history([ref320]).model_copy(update={"cost": cost}), screens=4) is None


def test_a_trade_off_move_earns_nothing_for_ruling_out_while_the_native_window_is_there():
    """A lower C may lose on the objective by design, so its negative closes no hypothesis (closes_hypothesis):
    near the TPOT limit it is worth its small gain only, unless the native window is missing (then a lower C may
    give one, and ruling that out counts)."""
    from agent.planner.candidates import rule_for
    from agent.planner.deterministic import closes_hypothesis
    from agent.planner.value import value_of

    d = diagnose(summary(tpot=19.6), DECODE_BOUND, TPOT20, {})
    assert d.likelihood("latency_bound") >= 0.7
    card = screen("concurrency", 64)
    rule = rule_for("concurrency", "down")
    assert rule.tradeoff and closes_hypothesis("negative", card, history()) is None
    v = value_of(card, rule, d, 0.1, 24.0)
    assert v.rules_out == 0.0 and "rules out 0.00" in v.why
    windowless = value_of(card, rule, d, 0.1, 24.0, native_missing=True)
    assert windowless.rules_out > 0.0 and windowless.value > v.value
