"""Histories built from real simulator runs of the bench's library cases (bench/scenarios.yaml): the start station
measured once (its summary and evidence digest, as the executor would read them), for planner-level tests."""
from __future__ import annotations

from pathlib import Path

from agent.planner.candidates import build_card
from agent.planner.history import Figures, History, Outcome
from bench.tuners.cases import load_cases
from core import profiles
from core.metrics import summarize
from core.station import full_knobs
from executor.evidence import digest_run
from simulator import engine

ROOT = Path(__file__).resolve().parents[1]
CASES = {c.name: c for c in load_cases(ROOT / "bench" / "scenarios.yaml").cases}


def goal_of(case: str, seed: int = 0, **start):
    goal = CASES[case].goal_spec(False, seed)
    return goal.model_copy(update={"start_knobs": dict(goal.start_knobs) | start}) if start else goal


def measure(tmp_path: Path, goal, card, decision: str, seed: int = 0) -> Outcome:
    """One simulated run of a card's station, summarised and digested as the executor would, as an Outcome."""
    knobs = full_knobs(card.knobs, "sim")
    prof = profiles.load(goal.sim_profile)
    run = engine.simulate(prof, goal.scenario, knobs, n=card.n, warmup=goal.protocol.warmup, seed=seed)
    out = tmp_path / f"{card.experiment_key}-{seed}"
    engine.write_run_dir(run, out)
    s = summarize(run.records, run.info, native_min_requests=goal.protocol.native_min_requests,
                  native_min_seconds=goal.protocol.native_min_seconds)
    return Outcome(card=card, verdict="valid", decision=decision, summary=s, evidence=digest_run(out, run.info, knobs),
                   run_id=card.run_id(), figures=Figures.of(s, goal.objective.metric, goal.constraints.violations(s)))


def measured_start(tmp_path: Path, case: str, n: int = 320, seed: int = 0, **start) -> History:
    """The case's goal with its start station (changed by `start`) measured at N once, as a reference."""
    goal = goal_of(case, seed, **start)
    knobs = goal.start_station()
    card = build_card("g1", goal.scenario, knobs, None, None, stage="baseline", n=n)
    o = measure(tmp_path, goal, card, "reference", seed)
    return History(goal_id="g1", goal=goal, data_version="dv1", best_knobs=knobs, warm_knobs=knobs, outcomes=[o],
                   budget_left_card_hours=goal.budget.card_hours, experiments_left=goal.budget.experiments)
