"""The rules and the explorer on real simulator evidence of the bench's library profiles (issue 16): expert load
leads to a relayout where imbalance dominates and not where it does not; acceptance per draft position values a
width change the right way round; an infeasible best is never a reason to stop; the explorer's card is an
experiment card that passes the same checks as a rule's."""
from __future__ import annotations

import prompts
from agent.planner import rules
from agent.planner.candidates import rule_for
from agent.planner.checks import check
from agent.planner.proposers.explorer import propose
from agent.planner.history import Negative
from agent.planner.llm import system_prompt
from agent.planner.deterministic import DeterministicPlanner, candidates, diagnosis_for
from agent.planner.stops import MIN_VALUE
from core.knobs import catalog, named
from tests.rules_support import measure, measured_start


def _answered_except(history, knob):
    """The history with every other rule move from the start tested negative (and a confirm-N reference)."""
    ref = history.outcomes[0]
    h = history.model_copy(update={"outcomes": [ref, ref.model_copy(update={"card": ref.card.model_copy(
        update={"n": history.goal.protocol.confirm_n})})]})
    negs = [Negative(knob=c.change.knob, value=c.change.new, scenario=h.goal.scenario, data_version="dv1",
                     parent_station=c.parent_knobs_hash, source_identity="sim", experiment_key=f"x{i}")
            for i, (c, _) in enumerate(candidates(h, diagnosis_for(h))) if c.change.knob != knob]
    return h.model_copy(update={"negatives": negs})


def _move(history, knob, new):
    diag = diagnosis_for(history)
    return next((c, v) for c, v in candidates(history, diag) if c.change.knob == knob and c.change.new == new)


def test_every_rule_is_registered_once_and_writes_its_line_of_the_system_prompt():
    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names)) >= 8
    for need in ("prefill_supply", "client_supply", "decode_capacity", "latency_bound", "spec_acceptance",
                 "expert_imbalance", "kv_transfer", "kv_capacity"):
        assert need in names
    text = system_prompt()
    assert "$rules" in prompts.load("system").template and "$rules" not in text
    for r in rules.RULES:
        assert r.prompt in text
    for (role, direction), move in rules.MOVES.items():  # the move table is the rules' own moves, keyed by role
        knob = named(role, catalog().defaults("sim"))
        assert knob is not None and rule_for(knob, direction) is move


def test_expert_load_leads_to_a_relayout_where_imbalance_dominates_and_not_where_it_is_small(tmp_path):
    skewed = measured_start(tmp_path, "qwen3-235b-h800-expert-imbalance")
    d = diagnosis_for(skewed)
    assert d.get("expert_imbalance").status == "supported" and d.imbalance_loss > 0.1
    card, v = _move(skewed, "expert_layout", "static_eplb")
    assert v.value >= MIN_VALUE and v.gain > 0.1 and not check(card, skewed)
    # once the cheaper moves are answered (negative), the relayout is the rules' card, not the explorer's
    answered = _answered_except(skewed, "expert_layout")
    plan = DeterministicPlanner().ask(answered)
    assert plan.card is not None and plan.card.change.knob == "expert_layout", plan.ranked[:3]
    assert plan.card.hypothesis == "expert_imbalance" and "relayout wins back" in plan.ranked[-1].why + str(plan.ranked)

    balanced = measured_start(tmp_path, "qwen3-30b-910b-prefill-bound")
    d = diagnosis_for(balanced)
    assert d.get("expert_imbalance").status == "weak" and d.imbalance_loss is not None and d.imbalance_loss < 0.05
    _, v = _move(balanced, "expert_layout", "static_eplb")
    assert v.value < MIN_VALUE and v.gain == 0.0


def test_acceptance_per_position_values_a_draft_width_change_the_right_way_round(tmp_path):
    wins = measured_start(tmp_path, "deepseek-v3-910c-wider-mtp-wins")  # k = 1, acceptance stays high
    assert diagnosis_for(wins).spec_positions is not None
    _, up = _move(wins, "num_speculative_tokens", 2)
    assert up.gain > 0.1 and up.value >= MIN_VALUE and "acceptance model" in up.why

    loses = measured_start(tmp_path, "llama31-8b-l40s-wider-draft-loses")  # k = 3, acceptance falls fast
    _, wider = _move(loses, "num_speculative_tokens", 4)
    _, narrower = _move(loses, "num_speculative_tokens", 2)
    assert wider.gain == 0.0 and wider.value < MIN_VALUE  # predicted to lose: worth nothing
    assert narrower.gain > 0.0 and narrower.value > wider.value


def test_an_infeasible_best_goes_toward_feasibility_never_a_stop(tmp_path):
    h = measured_start(tmp_path, "llama33-70b-910b-above-slo")
    assert h.outcomes[0].figures.slo_violations  # the start breaks its TPOT limit
    h = h.model_copy(update={"outcomes": h.outcomes + [h.outcomes[0].model_copy(update={
        "card": h.outcomes[0].card.model_copy(update={"n": 640})})]})
    plan = DeterministicPlanner().ask(h)
    assert plan.card is not None and plan.card.change is not None
    assert (plan.card.change.knob, plan.card.change.new < plan.card.change.old) in (
        ("concurrency", True), ("max_num_seqs", True))  # fewer in flight or a smaller decode batch: lower TPOT
    # even when every rule move has been tested negative, the explorer goes on while the budget lasts
    negs = [Negative(knob=c.change.knob, value=c.change.new, scenario=h.goal.scenario, data_version="dv1",
                     parent_station=c.parent_knobs_hash, source_identity="sim", experiment_key=f"x{i}")
            for i, (c, _) in enumerate(candidates(h, diagnosis_for(h)))]
    stale = h.model_copy(update={"negatives": negs})
    plan = DeterministicPlanner().ask(stale)
    assert plan.card is not None, plan.stop_reason
    assert plan.card.mechanism.startswith("exploration:") and not check(plan.card, stale)


def test_the_explorers_card_passes_the_same_checks_and_never_repeats_a_negative(tmp_path):
    h = measured_start(tmp_path, "qwen25-32b-h100-starved-sender")
    props, told = propose(h, "test")
    assert told == 1 and props
    first = props[0].card
    assert first.mechanism.startswith("exploration: Optuna TPE") and first.stage == "screen"
    assert "predicted output_tok_s_per_card" in first.expected_effect and "interval" in first.expected_effect
    assert not check(first, h) and first.est_card_hours is not None
    again, _ = propose(h, "test")
    assert [p.card.experiment_key for p in again] == [p.card.experiment_key for p in props]  # deterministic
    neg = Negative(knob=first.change.knob, value=first.change.new, scenario=h.goal.scenario, data_version="dv1",
                   parent_station=first.parent_knobs_hash, source_identity="sim", experiment_key="x")
    after, _ = propose(h.model_copy(update={"negatives": [neg]}), "test")
    assert first.experiment_key not in {p.card.experiment_key for p in after}


def test_a_stale_streak_stops_only_when_the_explorer_expects_less_than_min_gain(tmp_path):
    """Flat case: three one-change screens from the start change nothing; the stop names the streak and the
    explorer's expected improvement below min_gain_pct. A varied space (the starved sender) keeps exploring."""
    def streak(case):
        h = measured_start(tmp_path, case)
        moves = [c for c, _ in candidates(h, diagnosis_for(h))][:3]
        outs = [measure(tmp_path, h.goal, c.model_copy(update={"stage": "screen", "n": 320}), "negative") for c in moves]
        k = h.goal.stop.max_without_improvement
        assert len(outs) == k == 3
        return h.model_copy(update={"outcomes": h.outcomes + outs})

    flat = streak("llama31-8b-910b-flat")
    plan = DeterministicPlanner().ask(flat)
    assert plan.card is None, plan.card
    assert plan.stop_reason.startswith("3 experiments in a row changed nothing, and the explorer expects at most")
    assert "< min_gain_pct 1 %" in plan.stop_reason and "over 4 valid run(s)" in plan.stop_reason

    varied = streak("qwen25-32b-h100-starved-sender")
    plan = DeterministicPlanner().ask(varied)
    assert plan.card is not None and plan.card.mechanism.startswith("exploration:"), plan.stop_reason


def test_two_measured_draft_widths_price_a_position_with_its_verification_and_turn_the_next_move(tmp_path):
    """The breakdown's draft share prices the draft passes only; every position also adds a token per sequence to
    the verification pass. On the profile where acceptance falls fast, k 3 -> 2 measured at the same batch prices
    a position at several times the draft share, the model then rates k 2 -> 1 a gain (the breakdown alone rates
    it a loss), and the simulator agrees: k = 1 beats k = 2 at that station."""
    from agent.planner.candidates import build_card
    from agent.planner.deterministic import _diagnose
    from agent.planner.rules.spec_acceptance import fitted_cost, predicted_gain

    h = measured_start(tmp_path, "llama31-8b-l40s-wider-draft-loses", n=640)
    goal = h.goal
    k2 = build_card("g1", goal.scenario, h.best_knobs, "num_speculative_tokens", 2, stage="confirm", n=640)
    o2 = measure(tmp_path, goal, k2, "new_best")
    assert fitted_cost(h, h.best_knobs) is None  # one width: nothing to fit
    two = h.model_copy(update={"outcomes": h.outcomes + [o2], "best_knobs": k2.knobs, "warm_knobs": k2.knobs})
    c, why = fitted_cost(two, two.best_knobs)
    d = _diagnose(two)
    share_only = diagnosis_for(h).draft_cost  # the breakdown's draft share at k = 3
    assert d.draft_cost == round(c, 4) and c > 2 * share_only and "fitted from the step time at k 2 and 3" in why
    assert predicted_gain(d.spec_positions, 2, 1, share_only) < 0 < predicted_gain(d.spec_positions, 2, 1, c)
    _, narrower = _move(two, "num_speculative_tokens", 1)
    assert narrower.gain > 0 and "fitted from the step time" in narrower.why
    k1 = build_card("g1", goal.scenario, k2.knobs, "num_speculative_tokens", 1, stage="confirm", n=640)
    o1 = measure(tmp_path, goal, k1, "new_best")
    assert o1.figures.whole > o2.figures.whole  # the simulator's answer: the narrower draft wins

    # with k = 1 and k = 2 measured from the k = 3 start, the model sizes k 3 -> 1 in one move
    from agent.planner.rules.spec_acceptance import sized
    three = h.model_copy(update={"outcomes": h.outcomes + [o2, o1.model_copy(update={"card": build_card(
        "g1", goal.scenario, h.best_knobs, "num_speculative_tokens", 1, stage="confirm", n=640)})]})
    jump = sized("num_speculative_tokens", 3, [1, 2, 3, 4], three, _diagnose(three))
    assert jump is not None and jump[:2] == ("down", 1), jump


def test_prefill_evidence_sizes_the_budget_to_a_prompt_and_the_instances_to_the_queue(tmp_path):
    """Prefill-bound 8K summarisation on the library's MoE: a 2048-token budget splits each ~8.2K-token prompt
    into five passes, so the budget jumps to the listed value that holds one (16384, past 4096 and 8192); with
    the prefill instances saturated and ~90 requests queueing for them against ~17 in decode, the instances
    double (2 -> 4, not the next listed 3), again from 4 (-> 8), and at 8, where decode holds most of the
    requests, the evidence sizes no jump."""
    from agent.planner.candidates import build_card

    h = measured_start(tmp_path, "qwen3-30b-910b-prefill-bound")
    card, v = _move(h, "max_num_batched_tokens", 16384)
    assert "holds one in a single pass" in card.expected_effect and not check(card, h)
    _, step = _move(h, "max_num_batched_tokens", 4096)
    assert step.value < v.value and "the evidence sizes a jump to 16384" in step.why

    def at(p: int):
        return measured_start(tmp_path, "qwen3-30b-910b-prefill-bound", n=640, max_num_batched_tokens=16384,
                              num_prefill_instances=p)

    for p, jump, plain in ((2, 4, 3), (4, 8, 6)):
        hp = at(p)
        card, v = _move(hp, "num_prefill_instances", jump)
        assert f"so {p} -> {jump} instances" in card.expected_effect and not check(card, hp), card.expected_effect
        _, one = _move(hp, "num_prefill_instances", plain)
        assert one.value < v.value
    from agent.planner.rules.prefill_supply import sized
    h8 = at(8)
    values = h8.goal.space()["num_prefill_instances"]
    assert sized("num_prefill_instances", 8, values, h8, diagnosis_for(h8)) is None
    card, _ = _move(h8, "num_prefill_instances", 10)  # the next listed value, in the rule's own words
    assert card.expected_effect == build_card("g1", h8.goal.scenario, h8.best_knobs, "num_prefill_instances", 10,
                                              stage="screen", n=320).expected_effect


def test_a_binding_request_cap_is_sized_to_the_prompts_the_budget_holds_and_the_requests_waiting(tmp_path):
    """2K chat prompts behind a prefill request cap of 1 with an 8192-token budget: batches carry one request
    and use a quarter of the budget. With requests queueing for prefill the cap jumps to the listed value the
    budget holds (8192 / ~2020 -> 4, past the next listed 2); at the start's arrival rate nothing waits, so
    there is nothing to batch beyond the next value and the evidence sizes no jump."""
    from agent.planner.rules.prefill_supply import sized

    queued = measured_start(tmp_path, "dsv4-chat2k-wide", n=640, request_rate=12)
    d = diagnosis_for(queued)
    assert d.prefill_limit == "request_cap", d.prefill_limit_why
    card, v = _move(queued, "max_prefill_reqs", 4)
    assert "a cap of 4 fills the pass" in card.expected_effect and "holds 4.1 mean uncached prompts" in \
        card.expected_effect and not check(card, queued), card.expected_effect
    _, one = _move(queued, "max_prefill_reqs", 2)
    assert one.value < v.value and "the evidence sizes a jump to 4" in one.why

    idle = measured_start(tmp_path, "dsv4-chat2k-wide", n=640)  # 6 requests/s: the prefill queue is empty
    di = diagnosis_for(idle)
    assert di.prefill_limit == "request_cap"
    assert sized("max_prefill_reqs", 1, idle.goal.space()["max_prefill_reqs"], idle, di) is None

    # at the cap of 4, batches carry the ~1-2 requests that wait and use about a third of the budget: a bigger
    # budget adds no tokens to them, where the 8K prompts behind a 2048-token budget fill it and gain
    spare = measured_start(tmp_path, "dsv4-chat2k-wide", n=640, request_rate=12, max_prefill_reqs=4)
    ds = diagnosis_for(spare)
    assert ds.prefill_limit is None and ds.prefill_budget_fill < 0.5
    _, bigger = _move(spare, "max_num_batched_tokens", 16384)
    assert bigger.gain == 0.0 and "adds no tokens to them" in bigger.why and bigger.value < MIN_VALUE
    full = measured_start(tmp_path, "qwen3-30b-910b-prefill-bound")
    _, grows = _move(full, "max_num_batched_tokens", 16384)
    assert grows.gain > 0.0 and grows.value >= MIN_VALUE
