"""Builders shared by the planner tests: summaries, outcomes, histories and cards made by hand."""
from __future__ import annotations

from pathlib import Path

from agent.planner.candidates import build_card
from agent.planner.history import Figures, History, Outcome
from core.summary import Dist, Summary, WindowFigures
from state.goal import load_goal
from core.limits import limit_of

ROOT = Path(__file__).resolve().parents[1]
TPOT20 = (limit_of("tpot_mean_ms_lt", 20.0),)  # the seed goal's mean TPOT limit, as diagnose reads limits
GOAL16 = load_goal(ROOT / "examples" / "goal-16k.yaml")

PREFILL_BOUND = {  # the field report's cap-1 picture: P queue always busy, D starved
    "prefill_waiting_mean": 40.0, "prefill_waiting_nonzero_share": 0.95, "decode_waiting_mean": 0.0,
    "decode_waiting_nonzero_share": 0.0, "decode_running_mean": 60.0, "decode_running_max": 80.0,
    "decode_batch_limit": 256.0, "decode_kv_usage_max": 0.4, "spec_accept_length": None, "prefill_batch_reqs_mean": 1.0,
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
