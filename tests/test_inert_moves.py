"""Issue 38: no card runs whose change the evidence shows cannot move the objective (a cap that does not bind,
raised), whoever proposes it; the three moves the field-report walk-through ran (the prefill request cap raised
while the batches filled the token budget; C 128 -> 160, then -> 192, with 93 in flight) are refused, the same
moves where the cap binds are not."""
from __future__ import annotations

from agent.planner import checks
from agent.planner.proposers import explorer
from agent.planner.cards import Change
from agent.planner.checks import check
from agent.planner.refusals import RefusalKind
from agent.planner.deterministic import DeterministicPlanner
from agent.planner.inert import CLEAR_OF_CAP, learns
from agent.planner.pairs import build_pair
from tests.planner_support import GOAL16, PREFILL_BOUND, baseline, history, outcome, screen, summary

START = GOAL16.start_station()
BUDGET_FULL_EV = PREFILL_BOUND | {"prefill_batch_tokens_mean": 8192.0, "prefill_batch_reqs_mean": 1.0}  # 100 %
BUDGET_SPARE_EV = PREFILL_BOUND | {"prefill_batch_tokens_mean": 4096.0}  # half the 8192-token budget


def inert(card, h) -> list[str]:
    return [str(r) for r in check(card, h) if r.kind is RefusalKind.INERT]


def measured(ev=PREFILL_BOUND, conc: float = 120.0, knobs=None, more=()):
    """A history whose best station (`knobs`, the start by default) ran at the screen N with this evidence."""
    return history([outcome(baseline(knobs), run(conc), "reference", ev), *more], best=knobs)


def run(conc: float, tok: float = 180.0):
    """A run's Summary with `conc` in flight on average in both windows (the native one is what the check reads)."""
    s = summary(conc=conc, whole=tok, native=tok)
    return s.model_copy(update={"native": s.native.model_copy(update={"achieved_concurrency": conc})})


def test_a_prefill_request_cap_raised_into_a_full_token_budget_is_refused():
    h = measured(BUDGET_FULL_EV)
    for new in (2, 8):
        got = inert(screen("max_prefill_reqs", new), h)
        assert got and "fill 100% of the 8192-token budget" in got[0] and "cannot add tokens" in got[0]


def test_the_explorer_proposes_no_prefill_request_cap_raise_into_a_full_budget(monkeypatch):
    other = {**START, "concurrency": 64}  # a second station, so the model has two runs to go by
    h = measured(BUDGET_FULL_EV, more=[outcome(screen("concurrency", 64), run(120.0, 150.0),
                                               "negative", BUDGET_FULL_EV)])
    assert h.latest_valid(other) is not None

    def raises_cap(props):
        return [p.card.title() for p in props for c in p.card.changes
                if c.knob == "max_prefill_reqs" and c.new is not None and c.new > c.old]

    monkeypatch.setattr(checks, "inert_refusal", lambda card, history: None)  # the check removed: the explorer
    without, _ = explorer.propose(h, "test")  # does propose such a raise here
    assert raises_cap(without)
    monkeypatch.undo()
    got, _ = explorer.propose(h, "test")
    assert got and not raises_cap(got)


def test_c_raised_while_the_clients_were_never_all_in_flight_is_refused():
    h = measured(conc=93.1)
    got = inert(screen("concurrency", 160), h)
    assert got and "achieved concurrency 93.1 < C 128" in got[0] and "raising C cannot add load" in got[0]


def test_after_c_160_changed_nothing_c_192_is_refused_as_well():
    ran = outcome(screen("concurrency", 160), run(93.4), "negative")
    h = measured(conc=93.1, more=[ran])
    assert inert(screen("concurrency", 192), h)
    plan = DeterministicPlanner().ask(h)  # whatever the planner picks, it is no C raise
    assert plan.card is None or not any(c.knob == "concurrency" and c.new > c.old for c in plan.card.changes)
    rows = [r.why for r in plan.ranked if r.title.startswith("screen N=320: concurrency 128 -> 1")]
    assert rows and all("inert:" in why or "measured:" in why for why in rows)  # 160 ran: measured, not inert


def test_the_same_moves_pass_where_the_cap_binds():
    h = measured(BUDGET_SPARE_EV, conc=125.0)  # in flight ≈ C; batches at half the budget
    assert not inert(screen("concurrency", 160), h)
    assert not inert(screen("max_prefill_reqs", 2), h)
    assert 125.0 / 128 >= CLEAR_OF_CAP  # the control sits on the binding side of the margin


def test_lowering_a_cap_the_rate_and_a_pair_with_one_binding_change_are_not_refused():
    h = measured(BUDGET_SPARE_EV, conc=93.1)
    assert not inert(screen("concurrency", 90), h)  # a lower C may move latency
    assert not inert(screen("request_rate", 8), h)  # the arrival rate is the lever, not a cap
    pair = build_pair(h, ("concurrency", 160), ("max_prefill_reqs", 2), coupling="a test's coupling")
    assert not inert(pair, h)  # the request cap binds (half the budget used), so the pair is not inert
    both = measured(BUDGET_FULL_EV, conc=93.1)
    pair = build_pair(both, ("concurrency", 160), ("max_prefill_reqs", 2), coupling="a test's coupling")
    assert len(inert(pair, both)[0].split("; ")) == 2  # every change inert: refused, naming both


def test_a_pair_of_an_idle_raise_and_a_load_cut_is_refused_and_one_with_a_load_raise_is_not():
    """A cap idle at the parent's load stays idle at a lower one: the pair learns what the cut alone would. A
    higher rate may fill C, so C raised with it is no inert pair."""
    h = measured(BUDGET_SPARE_EV, conc=93.1)
    cut = build_pair(h, ("concurrency", 160), ("request_rate", 4), coupling="the explorer's pair")
    got = inert(cut, h)
    assert got and "achieved concurrency 93.1 < C 128" in got[0] and "request_rate 6.0 -> 4" in got[0]
    assert not inert(build_pair(h, ("concurrency", 160), ("request_rate", 8), coupling="the explorer's pair"), h)
    knobs = {**START, "max_num_seqs": 128}
    idle = measured(PREFILL_BOUND | {"decode_running_max": 60.0, "decode_batch_limit": 128.0}, knobs=knobs)
    assert inert(build_pair(idle, ("max_num_seqs", 256), ("concurrency", 90), coupling="the explorer's pair"), idle)


def test_a_batch_cap_that_never_bound_is_refused_and_one_at_its_peak_is_not():
    knobs = {**START, "max_num_seqs": 128}
    idle = measured(PREFILL_BOUND | {"decode_running_max": 60.0, "decode_batch_limit": 128.0}, knobs=knobs)
    got = inert(screen("max_num_seqs", 256, parent=knobs), idle)
    assert got and "peaked at 60 of a 128 batch cap" in got[0]
    full = measured(PREFILL_BOUND | {"decode_running_max": 128.0, "decode_batch_limit": 128.0}, knobs=knobs)
    assert not inert(screen("max_num_seqs", 256, parent=knobs), full)


def test_evidence_without_the_figure_refuses_nothing():
    bare = {k: v for k, v in BUDGET_FULL_EV.items()
            if k not in ("prefill_batch_tokens_mean", "decode_running_max", "decode_batch_limit")}
    h = measured(bare)
    assert not inert(screen("max_prefill_reqs", 2), h)


def test_only_a_card_that_tests_another_open_hypothesis_most_cheaply_is_excepted():
    h = measured(conc=93.1)
    own = screen("concurrency", 160)  # the rule's own question, which the evidence answered
    assert learns(own, h) is None and inert(own, h)
    other = own.model_copy(update={"hypothesis": "kv_capacity",
                                   "negative_rules_out": "KV space as what admits sequences at this load"})
    assert learns(other, h) is not None and not inert(other, h)  # C is hot: no cheaper move tests it
    dear = screen("max_prefill_reqs", 2).model_copy(update={"hypothesis": "client_supply",
                                                            "negative_rules_out": "the sender as the limit"})
    assert learns(dear, measured(BUDGET_FULL_EV)) is None  # a hot move (r, C) tests client supply more cheaply


def test_a_measured_station_is_not_refused_again():
    """The confirm of a screen that ran: its measurement outranks the evidence's reading."""
    ran = outcome(screen("concurrency", 160), run(93.4, 190.0), "promising")
    h = measured(conc=93.1, more=[ran])
    conf = screen("concurrency", 160).model_copy(update={"stage": "confirm", "n": 640})
    assert not inert(conf, h)
    assert Change(knob="concurrency", old=128, new=160) == conf.change
