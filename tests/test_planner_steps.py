"""The deterministic planner's `ask` is a pipeline of named steps (agent/planner/deterministic.py STEPS): each step is
a function of one ask's reading of the history that answers a plan or passes, and each is tested here alone."""
from __future__ import annotations

from agent.planner.deterministic import (STEPS, Asked, DeterministicPlanner, confirm_screen, explore, rank, recover,
                                         reference, screen_reference, spent, warm_reference)
from agent.planner.plan import Plan
from tests.planner_support import GOAL16, baseline, history, outcome, screen, summary


def test_ask_runs_its_steps_in_one_listed_order():
    assert [s.__name__ for s in STEPS] == ["spent", "reference", "warm_reference", "recover", "confirm_screen",
                                           "rank", "explore"]


def test_spent_answers_only_when_no_experiment_is_left():
    measured = [outcome(baseline(), summary(), "reference")]
    assert spent(Asked(history(measured))) is None
    plan = spent(Asked(history(measured, experiments=0)))
    assert plan is not None and plan.card is None and plan.stop_reason == "experiment budget spent"


def test_reference_measures_the_start_at_confirm_n_and_passes_once_it_is_measured():
    plan = reference(Asked(history()))
    assert plan is not None and plan.card is not None and plan.card.stage == "baseline"
    assert plan.card.n == GOAL16.protocol.confirm_n and plan.diagnosis is None
    assert reference(Asked(history([outcome(baseline(), summary(), "reference")]))) is None


def test_warm_reference_takes_the_confirm_n_reference_while_the_start_is_warm_and_nothing_moved():
    measured = history([outcome(baseline(), summary(), "reference")])
    plan = warm_reference(Asked(measured))
    assert plan is not None and plan.card is not None and plan.card.n == GOAL16.protocol.confirm_n
    assert warm_reference(Asked(measured.model_copy(update={"warm_knobs": None}))) is None


def test_confirm_screen_confirms_a_promising_screen_after_its_parents_confirm_n_reference():
    up = screen("max_prefill_reqs", 2)
    h = history([outcome(baseline(), summary(), "reference"), outcome(up, summary(whole=230.0), "promising")])
    ref = confirm_screen(Asked(h))
    assert ref is not None and ref.card is not None and ref.card.stage == "baseline" and ref.card.n == 640
    h2 = history(h.outcomes + [outcome(ref.card, summary(n=640), "reference")])
    conf = confirm_screen(Asked(h2))
    assert conf is not None and conf.card is not None and conf.card.stage == "confirm"
    assert confirm_screen(Asked(history([outcome(baseline(), summary(), "reference")]))) is None


def test_recover_passes_when_no_confirmed_gain_needs_keeping():
    assert recover(Asked(history([outcome(baseline(), summary(), "reference")]))) is None


def test_rank_chooses_a_move_and_explore_reads_its_ranking():
    h = history([outcome(baseline(), summary(), "reference"),
                 outcome(baseline(n=640), summary(n=640), "reference")]).model_copy(update={"warm_knobs": None})
    a = Asked(h)
    plan = rank(a)
    assert plan is not None and plan.move and plan.card is not None and plan.card.change is not None
    assert a.ranking is not None and plan.ranked == a.ranking.ranked
    # explore alone (as when nothing ranked is worth its cost) answers a card or a stop with its reason
    after = explore(a)
    assert isinstance(after, Plan) and (after.card is not None or after.stop_reason)


def test_screen_reference_puts_the_best_stations_screen_n_reference_before_a_screened_move():
    h = history([outcome(baseline(n=640), summary(n=640), "reference")])
    a = Asked(h)
    move = Plan(card=screen("max_prefill_reqs", 2), move=True)
    assert a.at_confirm  # measured at confirm N only
    got = screen_reference(a, move)
    assert got is not None and got.card is not None and got.card.stage == "baseline" and got.card.n == 320
    assert screen_reference(a, move.model_copy(update={"move": False})) is None  # protocol cards stand


def test_ask_is_the_first_plan_of_its_steps():
    h = history()
    assert DeterministicPlanner().ask(h) == reference(Asked(h))


def test_a_failed_quality_evaluation_rules_out_every_station_with_its_quality_risk_settings():
    """A failed accuracy evaluation is a fact of the model's outputs, not of the station's speed: a card that makes
    all of its quality-risk settings again, from any parent, is refused (and not a candidate at all); one that makes
    only part of a failed combination is not."""
    from agent.planner.checks import check
    from agent.planner.history import QualityFailure
    from agent.planner.refusals import GONE, RefusalKind
    from agent.planner.twin import runnable

    h = history([outcome(baseline(), summary(), "reference")])
    risky = screen("index_cache_reuse", True)
    assert QualityFailure.risky(risky.knobs) == (("index_cache_reuse", True),)
    assert RefusalKind.QUALITY_FAILED not in {r.kind for r in check(risky, h)}
    failed = h.model_copy(update={"quality_failures": [QualityFailure(settings=(("index_cache_reuse", True),),
                                                                      run_id="r-2")]})
    refused = [r for r in check(risky, failed) if r.kind is RefusalKind.QUALITY_FAILED]
    assert [str(r) for r in refused] == ["quality_failed: index_cache_reuse=True failed its quality evaluation "
                                         "(run r-2): never deployable"]
    assert RefusalKind.QUALITY_FAILED in GONE
    assert not runnable(failed, risky.knobs) and runnable(failed, GOAL16.start_station())
    other = screen("max_prefill_reqs", 2)
    assert RefusalKind.QUALITY_FAILED not in {r.kind for r in check(other, failed)}
    # a failed combination of two settings rules out stations that make both, not either alone
    pair = QualityFailure(settings=(("index_cache_reuse", True), ("max_prefill_reqs", 2)))
    assert pair.covers(risky.knobs | {"max_prefill_reqs": 2}) and not pair.covers(risky.knobs)
