"""The planner's recoveries and later moves: load headroom, a lost window, a TPOT-only gain kept by a batch cap,
negatives under changed conditions, retried faults, warm hot moves."""
from __future__ import annotations

from planner_support import DECODE_BOUND, GOAL16, PREFILL_BOUND, TPOT20, baseline, history, outcome, screen, summary

from agent.planner.candidates import station_hash, with_stage
from agent.planner.checks import check
from agent.planner.refusals import RefusalKind
from agent.planner.diagnosis import diagnose
from agent.planner.history import Figures, Negative, Outcome
from agent.planner.judgement import decide
from agent.planner.deterministic import DeterministicPlanner

HEADROOM = PREFILL_BOUND | {  # decode-bound GPU at a C-limited batch: no queue inside, TPOT well under its limit
    "prefill_waiting_mean": 0.0, "prefill_waiting_nonzero_share": 0.0, "decode_waiting_mean": 0.0,
    "decode_waiting_nonzero_share": 0.0, "decode_running_max": 120.0, "decode_batch_limit": 256.0,
    "prefill_tail_batch_share": 0.0}


def test_latency_headroom_with_c_capping_the_batch_names_load_headroom_and_raises_c_before_restarts():
    d = diagnose(summary(tpot=12.0, conc=126.0), HEADROOM, TPOT20, {})
    assert d.get("load_headroom").status == "supported" and d.get("client_supply").status == "weak"
    # the same headroom with a full prefill queue, or decode at its limit with waiting requests: not the load
    assert diagnose(summary(tpot=12.0, conc=126.0), PREFILL_BOUND, TPOT20, {}).get("load_headroom").status == "weak"
    assert diagnose(summary(tpot=12.0, conc=126.0), DECODE_BOUND, TPOT20, {}).get("load_headroom").status == "weak"
    assert diagnose(summary(tpot=19.0, conc=126.0), HEADROOM, TPOT20, {}).get("load_headroom").status != "supported"
    ref = baseline()
    h = history([outcome(ref, summary(tpot=12.0, conc=126.0), "reference", HEADROOM),
                 outcome(baseline(n=640), summary(n=640, tpot=12.0, conc=126.0, native=185.0), "reference", HEADROOM)],
                budget=400.0, experiments=40)
    plan = DeterministicPlanner().ask(h)
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.new, plan.card.cost_class) == ("concurrency", 160, "hot")
    assert "load_headroom" in plan.ranked[0].why


def test_confirm_without_the_objective_window_is_never_the_best_and_a_lower_c_recovers_it():
    best = GOAL16.start_station() | {"max_prefill_reqs": 2}
    ref640 = baseline(best, n=640)
    up = screen("max_num_batched_tokens", 16384, parent=best)
    conf = with_stage(up, "confirm", 640)
    f = lambda s: Figures.of(s, "output_tok_s_per_card", GOAL16.constraints.violations(s))  # noqa: E731
    h = history([outcome(baseline(best), summary(whole=200.0), "reference"),
                 outcome(ref640, summary(n=640, whole=220.0, native=236.0), "reference"),
                 outcome(up, summary(whole=230.0), "promising")], best=best, budget=400.0, experiments=40)
    d, why = decide(conf, "valid", f(summary(n=640, whole=260.0, native=None)), h)
    assert d == "window_pending" and "no valid native window" in why  # +18 % whole, but no objective figure
    h2 = history(h.outcomes + [outcome(conf, summary(n=640, whole=260.0, native=None), "window_pending")],
                 best=best, budget=400.0, experiments=40)
    rec = DeterministicPlanner().ask(h2).card
    # the recovery runs at confirm N from the pending station (one change: C down), never as a whole-window screen
    assert rec is not None and rec.stage == "confirm" and rec.n == 640 and rec.parent_knobs_hash == conf.knobs_hash
    assert (rec.change.knob, rec.change.old, rec.change.new) == ("concurrency", 128, 90)
    d2, why2 = decide(rec, "valid", f(summary(n=640, whole=250.0, native=340.0)), h2)
    assert d2 == "new_best" and "vs the best station" in why2 and "native" in why2  # whole fell: judged natively
    d3, _ = decide(rec, "valid", f(summary(n=640, whole=250.0, native=None)), h2)
    assert d3 == "negative"  # no window at C90 either: the next lower C is tried
    h3 = history(h2.outcomes + [outcome(rec, summary(n=640, whole=250.0, native=None), "negative")],
                 best=best, budget=400.0, experiments=40)
    nxt = DeterministicPlanner().ask(h3).card
    assert nxt is not None and nxt.change.new == 64 and nxt.parent_knobs_hash == conf.knobs_hash


def test_a_window_lost_to_slow_arrivals_is_recovered_by_a_higher_rate_before_a_lower_c():
    """The pending confirm never filled C (whole achieved 70 of 128): arrivals decided what was in flight, so
    the next rate up (window and throughput) is tried before the next C down (window at some throughput)."""
    best = GOAL16.start_station() | {"max_prefill_reqs": 2}
    up = screen("max_num_batched_tokens", 16384, parent=best)
    conf = with_stage(up, "confirm", 640)
    starved = summary(n=640, whole=260.0, native=None, conc=70.0)
    outs = [outcome(baseline(best), summary(whole=200.0), "reference"),
            outcome(baseline(best, n=640), summary(n=640, whole=220.0, native=236.0), "reference"),
            outcome(up, summary(whole=230.0), "promising"), outcome(conf, starved, "window_pending")]
    rec = DeterministicPlanner().ask(history(outs, best=best, budget=400.0, experiments=40)).card
    assert rec is not None and rec.stage == "confirm" and rec.n == 640 and rec.parent_knobs_hash == conf.knobs_hash
    assert (rec.change.knob, rec.change.old, rec.change.new) == ("request_rate", 6.0, 8)
    assert rec.hypothesis == "client_supply" and "arrivals" in rec.mechanism
    no_window = outcome(rec, summary(n=640, whole=262.0, native=None, conc=75.0), "negative")
    nxt = DeterministicPlanner().ask(history(outs + [no_window], best=best, budget=400.0, experiments=40)).card
    assert nxt is not None and (nxt.change.knob, nxt.change.new) == ("concurrency", 90)
    assert nxt.parent_knobs_hash == conf.knobs_hash  # still from the pending station, not from the rate-up one


def test_a_load_gain_that_breaks_only_tpot_is_kept_by_capping_the_decode_batch():
    """C128 -> 192 gained 10 % whole but mean TPOT crossed 20 ms (decode ran up to 187 where the best ran up to
    118): the next card caps the decode batch at 128 (the smallest listed value holding 118) from the violating
    station, at the confirm N, judged against the best station; nothing to recover when another constraint broke
    or when the load gained nothing."""
    best = GOAL16.start_station() | {"max_num_seqs": 256}
    ev_best = PREFILL_BOUND | {"decode_running_max": 118.0}
    ev_hot = PREFILL_BOUND | {"decode_running_max": 187.0}
    load = screen("concurrency", 192, parent=best)
    broke = summary(whole=198.0, tpot=21.4)
    viol = GOAL16.constraints.violations(broke)
    assert viol and all(v.startswith("tpot_mean_ms_lt") for v in viol)

    def ask(s_, figures_viol, ev=ev_hot):
        o = Outcome(card=load, verdict="valid", decision="negative", summary=s_, evidence=ev, run_id=load.run_id(),
                    figures=Figures.of(s_, "output_tok_s_per_card", figures_viol))
        h = history([outcome(baseline(best), summary(whole=180.0), "reference", ev_best),
                     outcome(baseline(best, n=640), summary(n=640, whole=182.0, native=185.0), "reference", ev_best),
                     o], best=best, budget=400.0, experiments=40)
        return DeterministicPlanner().ask(h), h

    plan, h = ask(broke, viol)
    card = plan.card
    assert card is not None and card.stage == "confirm" and card.n == 640 and card.parent_knobs_hash == load.knobs_hash
    assert (card.change.knob, card.change.old, card.change.new) == ("max_num_seqs", 256, 128)
    assert card.hypothesis == "latency_bound" and "queues before decode" in card.mechanism
    d, why = decide(card, "valid", Figures.of(summary(n=640, whole=190.0, native=195.0, tpot=18.9),
                                               "output_tok_s_per_card", []), h)
    assert d == "new_best" and "vs the best station (the parent breaks the SLO)" in why
    # a start that itself breaks the SLO stays the reference of its own screens (no anchor to move to)
    hot_start = Outcome(card=baseline(best), verdict="valid", decision="reference", summary=broke, evidence=ev_best,
                        run_id=baseline(best).run_id(), figures=Figures.of(broke, "output_tok_s_per_card", viol))
    h0 = history([hot_start], best=best, budget=400.0, experiments=40)
    _, why0 = decide(screen("max_num_seqs", 128, parent=best), "valid",
                     Figures.of(summary(whole=200.0, tpot=18.0), "output_tok_s_per_card", []), h0)
    assert "vs parent at N=320" in why0

    def recovery(c) -> bool:  # type: ignore[no-untyped-def]
        return c is not None and c.change is not None and c.change.knob == "max_num_seqs" and c.stage == "confirm"

    assert not recovery(ask(broke, viol + ["all_succeed: 3 requests failed"])[0].card)  # not latency alone
    assert not recovery(ask(summary(whole=180.5, tpot=21.4), viol)[0].card)  # no gain over the best to keep
    assert not recovery(ask(broke, viol, PREFILL_BOUND | {"decode_running_max": 120.0})[0].card)  # cap would not bind


def test_a_hot_load_move_keeps_a_floor_value_only_while_a_decode_batch_cap_is_available():
    from agent.planner.deterministic import candidates, diagnosis_for

    best = GOAL16.start_station() | {"max_num_seqs": 256}
    busy = PREFILL_BOUND | {"decode_running_max": 118.0}  # the load's own hypotheses see no headroom here
    s_ = summary(tpot=19.2)
    h = history([outcome(baseline(best), s_, "reference", busy)], best=best, budget=400.0, experiments=40)
    c_up = next(v for c, v in candidates(h, diagnosis_for(h)) if c.change.knob == "concurrency" and c.change.new == 160)
    assert c_up.value > 0.02 and "decode batch cap can keep" in c_up.why
    no_cap = h.model_copy(update={"goal": GOAL16.model_copy(update={"search_space": {
        k: v for k, v in GOAL16.search_space.items() if k != "max_num_seqs"}})})
    c_up2 = next(v for c, v in candidates(no_cap, diagnosis_for(no_cap))
                 if c.change.knob == "concurrency" and c.change.new == 160)
    assert "decode batch cap" not in c_up2.why and c_up2.value < c_up.value


def test_a_negative_is_proposed_again_once_its_conditions_changed():
    """max_num_seqs up was negative at C128 (C capped the batch); at C160 decode runs at its cap with waiting."""
    start = GOAL16.start_station() | {"max_num_seqs": 128}
    neg = Negative(knob="max_num_seqs", value=256, scenario=GOAL16.scenario, data_version="dv1",
                   parent_knobs_hash=station_hash(start), source_identity="sim", experiment_key="x")
    at_cap = DECODE_BOUND | {"decode_running_max": 128.0, "decode_batch_limit": 128.0}
    best = start | {"concurrency": 160}
    h = history([outcome(baseline(best), summary(tpot=12.0), "reference", at_cap),
                 outcome(baseline(best, n=640), summary(n=640, tpot=12.0, native=200.0), "reference", at_cap)],
                negatives=[neg], best=best, budget=400.0, experiments=40)
    plan = DeterministicPlanner().ask(h)
    assert plan.card is not None and (plan.card.change.knob, plan.card.change.new) == ("max_num_seqs", 256)
    assert "parent station changed" in (plan.card.note or "")
    same = history(h.outcomes, negatives=[neg.model_copy(update={"parent_knobs_hash": station_hash(best)})], best=best,
                   budget=400.0, experiments=40)
    assert all(c != ("max_num_seqs", 256) for c in [(p.card.change.knob, p.card.change.new)
                                                    for p in [DeterministicPlanner().ask(same)] if p.card])


def test_a_faulted_experiment_is_retried_as_a_new_attempt_never_a_dead_end():
    from agent.planner.checks import MAX_ATTEMPTS, with_attempt

    ref = baseline()
    up = screen("max_prefill_reqs", 2)
    fault = lambda card: Outcome(card=card, verdict="orchestration_fault", decision="fault")  # noqa: E731
    h = history([outcome(ref, summary(), "reference"), outcome(up, summary(whole=230.0), "promising"),
                 fault(baseline(n=640))], budget=400.0, experiments=40)
    nxt = DeterministicPlanner().ask(h).card
    assert nxt is not None and nxt.stage == "baseline" and nxt.n == 640  # not "already ran"
    again = with_attempt(nxt, h)
    assert again.attempt == 2 and again.experiment_key == nxt.experiment_key
    assert again.run_id() != nxt.run_id() and again.content_hash != nxt.content_hash
    worn = history(h.outcomes + [fault(baseline(n=640))] * (MAX_ATTEMPTS - 1), budget=400.0, experiments=40)
    assert any(r.kind is RefusalKind.FAULTS for r in check(baseline(n=640), worn))


def test_a_negative_rules_its_hypothesis_out_and_the_load_is_tried_next():
    """Decode waits at its batch cap, but raising the cap from this station changed nothing (the report's
    llama case: the cap was per instance and C split across them): the load, with TPOT headroom, is next."""
    best = GOAL16.start_station() | {"max_num_seqs": 128}
    at_cap = DECODE_BOUND | {"decode_running_max": 128.0, "decode_batch_limit": 128.0, "decode_waiting_mean": 3.0}
    up = screen("max_num_seqs", 256, parent=best)
    outs = [outcome(baseline(best), summary(tpot=12.0, conc=126.0), "reference", at_cap),
            outcome(baseline(best, n=640), summary(n=640, tpot=12.0, native=200.0, conc=126.0), "reference", at_cap)]
    before = DeterministicPlanner().ask(history(outs, best=best, budget=400.0, experiments=40))
    assert before.diagnosis.get("load_headroom").status == "weak"  # decode at its cap with waiting: not the load
    h = history(outs + [outcome(up, summary(tpot=12.0, conc=126.0), "negative", at_cap)], best=best, budget=400.0,
                experiments=40)
    plan = DeterministicPlanner().ask(h)
    assert plan.diagnosis.get("load_headroom").likelihood > before.diagnosis.get("load_headroom").likelihood
    assert plan.card is not None and (plan.card.change.knob, plan.card.change.new) == ("concurrency", 160)


def test_hot_moves_run_while_the_best_is_warm_and_a_measured_station_is_never_run_again():
    # no valid native window at C128: a lower C is an open question (and a hot one); the P cap is worth more
    outs = [outcome(baseline(), summary(), "reference"), outcome(baseline(n=640), summary(n=640), "reference")]
    warm = DeterministicPlanner().ask(history(outs, budget=400.0, experiments=40))
    assert warm.card is not None and (warm.card.change.knob, warm.card.change.new) == ("concurrency", 90)
    assert "warm" in warm.ranked[-1].why and warm.ranked[0].title.endswith("max_prefill_reqs 1 -> 2")
    cold = history(outs, budget=400.0, experiments=40).model_copy(update={"warm_knobs": None})
    assert DeterministicPlanner().ask(cold).card.change.knob == "max_prefill_reqs"  # nothing warm to save
    best = GOAL16.start_station() | {"request_rate": 8}
    back = screen("request_rate", 6.0, parent=best)  # back to the start: measured at N=320 already
    h = history(outs + [outcome(baseline(best), summary(), "reference")], best=best, budget=400.0, experiments=40)
    assert any(r.kind is RefusalKind.MEASURED for r in check(back, h))
    # measured at the confirm N (a pair's or a jump's direct confirm, a recovery): its screen answers nothing more
    up = screen("request_rate", 10.0, parent=best)
    assert not any(r.kind is RefusalKind.MEASURED for r in check(up, h))
    at_confirm = history(h.outcomes + [outcome(with_stage(up, "confirm", 640), summary(n=640), "negative")],
                         best=best, budget=400.0, experiments=40)
    refused = [r for r in check(up, at_confirm) if r.kind is RefusalKind.MEASURED]
    assert refused and "confirm N=640" in refused[0].words


def test_decode_only_reads_the_limits_a_run_breaks_not_the_words_of_its_violations():
    """A run broke only decode-side limits when every violation recorded is a limit its summary breaks, each on the
    decode side: a broken TTFT limit, or a contract's violation beside a broken TPOT limit, is not decode-only."""
    from types import SimpleNamespace as NS

    from agent.planner.recovery import decode_only
    from core.goalview import GoalView
    from core.limits import Terms, limit_of

    view = GoalView(metric="output_tok_s", window="whole",
                    terms=Terms((limit_of("tpot_mean_ms_lt", 30.0), limit_of("ttft_p99_ms_lt", 2000.0))))

    def run(tpot: float, ttft: float, violations: list[str]):
        s = NS(tpot_ms=NS(mean=tpot), ttft_ms=NS(p99=ttft))
        return NS(summary=s, figures=NS(slo_violations=violations))

    assert decode_only(run(35.0, 900.0, ["tpot_mean_ms_lt: tpot mean 35.000 ms is not below 30 ms"]), view)
    assert not decode_only(run(35.0, 2500.0, ["tpot_mean_ms_lt: ...", "ttft_p99_ms_lt: ..."]), view)
    assert not decode_only(run(35.0, 900.0, ["tpot_mean_ms_lt: ...", "all_succeed: 3 requests failed"]), view)
    assert not decode_only(run(25.0, 900.0, []), view)
    assert not decode_only(NS(summary=None, figures=NS(slo_violations=["tpot_mean_ms_lt: ..."])), view)
