"""Load steps by a TPOT line (agent/planner/tpot_fit.py) and screens that cannot see a load change (agent/planner/screens.py), on
real simulator evidence of the bench's library profiles: over its TPOT limit the start's load cut is sized by the
proportional bound and, once two batches are measured, by the fitted line; a C + max_num_seqs pair under 10 %
headroom runs only when the line gives it a fair chance, and jumps along the line where it gives a larger pair an
even chance (the target's mean batch carried by the closed-loop run model, not the fill held); a wider draft moves
the batch limit to where its scaled line meets the limit; a latency recovery caps the batch where the line keeps it
under the limit; a screen whose N holds the same load either way goes straight to confirm N, and its card passes
the same checks."""
from __future__ import annotations

from dataclasses import replace

from agent.planner.candidates import build_card
from agent.planner.checks import check
from agent.planner.deterministic import candidates, diagnosis_for
from agent.planner.screens import screen_blind, to_confirm
from agent.planner.tpot_fit import predicted_tpot, sized_down, tpot_line
from tests.rules_support import measure, measured_start

ABOVE = "llama33-70b-910b-above-slo"  # starts at ~54 ms against a 40 ms limit, decode batch ~180
MTP = "deepseek-v3-910c-wider-mtp-wins"


def _at_confirm(tmp_path, case, **start):
    h = measured_start(tmp_path, case, n=640, **start)
    return h, h.goal.view().decode_limit()  # the goal's mean TPOT limit, as the planner reads it (core/goalview.py)


def test_over_the_limit_the_load_cut_is_sized_by_the_proportional_bound_then_by_the_line(tmp_path):
    h, limit = _at_confirm(tmp_path, ABOVE)
    head = diagnosis_for(h).headroom
    assert head < 0
    space = h.goal.space()
    jump, why = sized_down("concurrency", 256, list(space["concurrency"]), h, head, limit)
    assert jump == 128 and "TPOT falls at most in proportion" in why  # 180 × 40 / 54 ≈ 133: 128 is listed
    assert sized_down("concurrency", 256, list(space["concurrency"]), h, 0.05, limit) is None  # feasible: no jump
    cards = {(c.change.knob, c.change.new): v for c, v in candidates(h, diagnosis_for(h)) if c.also is None}
    assert cards[("concurrency", 128)].value > cards[("concurrency", 192)].value  # the step is discounted
    assert "sizes a jump to 128" in cards[("concurrency", 192)].why
    # the cut ran and was still over the limit: two batches now give a line, and it sizes the next cut
    cut = build_card("g1", h.goal.scenario, h.best_knobs, "concurrency", 128, stage="confirm", n=640)
    h2 = h.model_copy(update={"outcomes": h.outcomes + [measure(tmp_path, h.goal, cut, "negative")]})
    line = tpot_line(h2, h2.best_knobs, 640, limit)
    assert line is not None and line.points == 2 and line.b > 0
    jump, why = sized_down("concurrency", 256, list(space["concurrency"]), h2, head, limit)
    assert jump == 96 and "the mean TPOT line over 2 run(s)" in why


def test_a_load_pair_under_ten_percent_headroom_runs_only_where_the_line_allows_it(tmp_path):
    # k 3 at C = max_num_seqs = 160 and 192: 9 % headroom at 192; the line gives 224 a fair chance
    h, limit = _at_confirm(tmp_path, MTP, num_speculative_tokens=3, max_num_seqs=160, concurrency=160)
    knobs = h.best_knobs | {"max_num_seqs": 192, "concurrency": 192}
    o = measure(tmp_path, h.goal, build_card("g1", h.goal.scenario, {**knobs, "concurrency": 160}, "concurrency", 192,
                                             stage="confirm", n=640), "new_best")
    h2 = h.model_copy(update={"outcomes": h.outcomes + [o], "best_knobs": knobs})
    assert 0 < diagnosis_for(h2).headroom < 0.1
    tpot, ok, words = predicted_tpot(h2, knobs | {"max_num_seqs": 224, "concurrency": 256}, limit)
    assert ok and "chance under the 20 ms limit" in words
    pairs = [c for c, _ in candidates(h2, diagnosis_for(h2)) if c.also is not None and c.hypothesis == "client_supply"]
    assert pairs and "the mean TPOT line over 2 run(s)" in pairs[0].coupling, [c.coupling for c in pairs]
    assert not check(pairs[0], h2)
    _, ok, _ = predicted_tpot(h2, knobs | {"max_num_seqs": 512, "concurrency": 512}, limit)
    assert not ok  # far past the limit on the line


def test_a_screen_that_holds_the_same_load_either_way_goes_straight_to_confirm(tmp_path):
    h = measured_start(tmp_path, MTP, concurrency=320, max_num_seqs=384)  # N = 320 = C: every request in flight
    card = build_card("g1", h.goal.scenario, h.best_knobs, "concurrency", 384, stage="screen", n=320)
    assert screen_blind(card, h) is None  # no confirm-N run of the parent to compare a confirm with
    ref = build_card("g1", h.goal.scenario, h.best_knobs, None, None, stage="baseline", n=640)
    h2 = h.model_copy(update={"outcomes": h.outcomes + [measure(tmp_path, h.goal, ref, "reference")]})
    why = screen_blind(card, h2)
    assert why is not None and "holds at most 320 request(s) in flight" in why
    conf = to_confirm(card, h2, why)
    assert conf.stage == "confirm" and conf.n == 640 and "straight to confirm N=640" in conf.note
    assert not check(conf, h2)
    other = build_card("g1", h.goal.scenario, h.best_knobs, "num_speculative_tokens", 2, stage="screen", n=320)
    assert screen_blind(other, h2) is None  # not a load change: the screen sees it
    lower = build_card("g1", h.goal.scenario, h.best_knobs, "concurrency", 256, stage="screen", n=320)
    assert screen_blind(lower, h2) is None  # 256 < 320 in flight: the screen sees the cut


def test_a_screen_that_deploys_too_little_of_a_load_change_to_see_its_effect_goes_straight_to_confirm(tmp_path):
    h = measured_start(tmp_path, MTP, concurrency=256, max_num_seqs=384)
    ref = build_card("g1", h.goal.scenario, h.best_knobs, None, None, stage="baseline", n=640)
    h2 = h.model_copy(update={"outcomes": h.outcomes + [measure(tmp_path, h.goal, ref, "reference")]})
    card = build_card("g1", h.goal.scenario, h.best_knobs, "concurrency", 384, stage="screen", n=320)
    # over 8 decode instances: at N = 320 the batch moves 32 -> 40 per instance, at the confirm's 640 32 -> 48,
    # so the screen deploys half the change and an expected 3 % shows as 1.5 %
    why = screen_blind(card, h2, gain=0.03)
    assert why is not None and "deploys 50% of the load change" in why and "inside the screen's 2% noise" in why, why
    assert screen_blind(card, h2, gain=0.2) is None  # a large expected effect still shows at the screen's N
    assert screen_blind(card, h2) is None  # without an expected effect only an invisible change is blind


def test_a_load_change_that_no_n_can_see_is_no_candidate(tmp_path):
    from agent.planner.screens import load_unchanged
    h = measured_start(tmp_path, ABOVE, concurrency=96)
    same = build_card("g1", h.goal.scenario, h.best_knobs, "max_num_seqs", 192, stage="confirm", n=640)
    assert load_unchanged(same, 640) is not None  # max_num_seqs 256 -> 192 above C = 96 never binds
    cut = build_card("g1", h.goal.scenario, h.best_knobs, "max_num_seqs", 64, stage="confirm", n=640)
    assert load_unchanged(cut, 640) is None
    moves = {(c.change.knob, c.change.new) for c, _ in candidates(h, diagnosis_for(h)) if c.also is None}
    assert ("max_num_seqs", 192) not in moves and ("concurrency", 128) in moves


IMBALANCE = "qwen3-235b-h800-expert-imbalance"  # starts at ~28.9 ms of a 30 ms limit, decode full at 128 with a queue


def test_near_the_limit_a_batch_raise_is_worth_its_chance_under_it_so_the_relayout_goes_first(tmp_path):
    from agent.planner.tpot_fit import load_chance

    h, limit = _at_confirm(tmp_path, IMBALANCE)
    head = diagnosis_for(h).headroom
    assert 0 < head < 0.1
    wider = h.best_knobs | {"max_num_seqs": 256}
    chance, words = load_chance(h, wider, limit)
    # one run: TPOT lies between T and g·T at g times the batch; the queue bounds g (the same C admits only what waits)
    assert 0 < chance < 0.1 and "no fixed cost to all fixed cost" in words, words
    assert "up to x1.7" in words or "up to x1.8" in words, words  # 128 running + 94 waiting, not the cap's x2
    more, words2 = load_chance(h, wider | {"concurrency": 384}, limit)  # more load from the client: the cap's x2
    assert "up to x2.00" in words2 and more < chance, words2
    ranked = [(c.change.knob, c.change.new, v) for c, v in candidates(h, diagnosis_for(h)) if c.also is None]
    top = ranked[0]
    assert top[:2] == ("expert_layout", "static_eplb"), ranked[:4]
    seqs = next(v for k, new, v in ranked if k == "max_num_seqs" and new == 256)
    assert "its chance under the latency limit" in seqs.why
    # with headroom (TPOT well under its limit) the same raise is not discounted
    h2, _ = _at_confirm(tmp_path, IMBALANCE, expert_layout="static_eplb")
    assert diagnosis_for(h2).headroom > 0.1
    seqs2 = next(v for c, v in candidates(h2, diagnosis_for(h2))
                 if c.also is None and c.change.knob == "max_num_seqs" and c.change.new == 256)
    assert "chance under the latency limit" not in seqs2.why


def test_the_closed_loop_batch_model_holds_the_fill_far_below_n_and_not_near_it():
    from agent.planner.tpot_fit import batch_at

    assert batch_at(199.4, 256, 256, 640, 1.0) == 199.4  # the measured station itself
    # a run of 640 through 256 slots spent δ = 640/199.4 - 640/256 ≈ 0.71 of a request's decode time in ramp and
    # drain; through 448 slots the same δ leaves ~299 running on average, not the fill-held 349
    assert abs(batch_at(199.4, 256, 448, 640, 1.0) - 640 / (640 / 448 + 640 / 199.4 - 640 / 256)) < 1e-9
    assert 295 < batch_at(199.4, 256, 448, 640, 1.0) < 305
    n = 64_000  # n far above the cap, the same ramp and drain: the run's fill holds (its batch ∝ its cap)
    run = n / (n / 256 + 0.71)
    assert abs(batch_at(run, 256, 448, n, 1.0) / (run * 448 / 256) - 1.0) < 0.01
    assert batch_at(120.0, 128, 256, 640, 2.0) < 2 * 120.0  # per instance: 320 requests each through 256 slots
    assert batch_at(128.0, 128, 256, 640, 1.0) == 256.0  # a run held full by its queue: no ramp to carry
    assert batch_at(128.0, 128, 512, 320, 1.0) == 320.0  # ...and never more running than the run has requests


def test_a_client_and_batch_pair_is_sized_along_the_line_by_the_closed_loop_batch(tmp_path):
    # static layout: 128 and 256 slots measured at C = 256, N = 640: the line (~16 + 0.043 ms per sequence) puts
    # C512 + max_num_seqs 448 at ~29 ms once the run's ramp and drain are carried (~299 running); held at the
    # measured fill the same pair would run ~349 and cross the 30 ms limit
    from agent.planner.tpot_fit import sized_pair

    h, limit = _at_confirm(tmp_path, IMBALANCE, expert_layout="static_eplb")
    o = measure(tmp_path, h.goal, build_card("g1", h.goal.scenario, h.best_knobs, "max_num_seqs", 256,
                                             stage="confirm", n=640), "new_best")
    h2 = h.model_copy(update={"outcomes": h.outcomes + [o], "best_knobs": h.best_knobs | {"max_num_seqs": 256}})
    space = h2.goal.space()
    c, s, words = sized_pair(h2, list(space["concurrency"]), list(space["max_num_seqs"]), limit)
    assert (c, s) == (512, 448) and "the largest listed pair there" in words, words
    line, run = tpot_line(h2, h2.best_knobs, 640, limit), o.evidence.decode_running_mean
    assert line.at(run * 448 / 256) > limit.limit_ms  # the fill-held batch would have called it over the limit
    ranked = [(c_, v) for c_, v in candidates(h2, diagnosis_for(h2)) if c_.also is not None]
    top, step = ranked[0], next(cv for cv in ranked if cv[0].also.new == 384)
    assert (top[0].change.new, top[0].also.new) == (512, 448) and "the mean TPOT line over 2 run(s)" in top[0].coupling
    assert not check(top[0], h2)
    assert step[1].value < top[1].value and "sizes a jump to concurrency=512" in step[1].why
    # without the second batch there is no line, and the pair moves one step
    h1 = h.model_copy(update={"best_knobs": h.best_knobs})
    assert sized_pair(h1, list(space["concurrency"]), list(space["max_num_seqs"]), limit) is None


def test_a_wider_draft_moves_the_batch_limit_to_where_its_scaled_line_meets_the_limit(tmp_path):
    # k 2 at C = 96 and 128 (max_num_seqs 128): the acceptance model values k 3 at ~+20 %, so TPOT at a batch falls
    # to ~0.83 of the k 2 line; the pair raises max_num_seqs to 256 (C fills it later, hot), not one step to 160
    h, limit = _at_confirm(tmp_path, MTP, num_speculative_tokens=2, max_num_seqs=128, concurrency=96)
    o = measure(tmp_path, h.goal, build_card("g1", h.goal.scenario, h.best_knobs, "concurrency", 128,
                                             stage="confirm", n=640), "new_best")
    h2 = h.model_copy(update={"outcomes": h.outcomes + [o], "best_knobs": h.best_knobs | {"concurrency": 128}})
    pairs = [(c, v) for c, v in candidates(h2, diagnosis_for(h2))
             if c.also is not None and c.change.knob == "num_speculative_tokens"]
    (top, tv), (step, sv) = pairs[0], next(cv for cv in pairs if cv[0].also.new == 160)
    assert (top.change.new, top.also.new) == (3, 256) and "× 0.83" in top.coupling, top.coupling
    assert sv.value < tv.value and not check(top, h2)
    # on the k 2 line itself (no draft change) a batch limit of 256 would break the limit
    line = tpot_line(h2, h2.best_knobs, 640, limit)
    from agent.planner.tpot_fit import batch_at
    assert line.at(batch_at(o.evidence.decode_running_mean, 128, 256, 640, 1.0)) > limit.limit_ms


def test_a_latency_recovery_caps_the_batch_where_the_line_keeps_it_under_the_limit(tmp_path):
    # k 3, max_num_seqs 256: C 128, 160, 192 under 20 ms, then C 256 at ~21 ms (a gain that broke only TPOT); the
    # line through the four runs keeps a cap of 224 under the limit less its spread: the recovery caps there, not
    # at 192 (the smallest cap holding what the best station ran)
    from agent.planner.recovery import latency_recovery

    h, limit = _at_confirm(tmp_path, MTP, num_speculative_tokens=3, max_num_seqs=256, concurrency=128)
    outs, knobs = list(h.outcomes), h.best_knobs
    for c in (160, 192):
        card = build_card("g1", h.goal.scenario, knobs, "concurrency", c, stage="confirm", n=640)
        outs.append(measure(tmp_path, h.goal, card, "new_best"))
        knobs = knobs | {"concurrency": c}
    hot = measure(tmp_path, h.goal, build_card("g1", h.goal.scenario, knobs, "concurrency", 256, stage="confirm",
                                               n=640), "negative")
    assert hot.summary.tpot_ms.mean > limit.limit_ms and hot.figures.slo_violations
    h2 = h.model_copy(update={"outcomes": outs + [hot], "best_knobs": knobs})
    card = latency_recovery(h2)
    assert card is not None and (card.change.knob, card.change.new) == ("max_num_seqs", 224), card
    assert "the mean TPOT line over 4 run(s)" in card.mechanism and card.knobs["concurrency"] == 256
    assert not check(card, h2)
    # under a tighter limit the line vouches for no cap above the one the best station's run holds: that one
    from agent.planner.recovery import line_cap
    assert line_cap(h2, hot, [192, 224], limit)[0] == 224
    assert line_cap(h2, hot, [192, 224], replace(limit, limit_ms=limit.limit_ms - 1.0)) is None
