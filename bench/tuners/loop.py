"""tuneloop itself, driven through the real loop: `agent.loop.session.run_session` with the real Executor
on the sim target, a fresh SQLite store and runs root per run. Its trials are read back from the store
(the record of truth): runs in judged order, their charged costs, and the best station after each.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.tuners.evaluate import Eval, of_summary
from bench.tuners.meter import Trial, charge
from core.profiles import Profile
from core.station import full_knobs

BEST_KINDS = ("baseline", "new_best", "quality_passed")


def run_loop(goal: Any, profile: Profile, space: dict[str, list[Any]], workdir: Path | None = None,
             truth: str | None = None, twin: bool | None = None, prior: str | None = None) -> dict[str, Any]:
    """Run the loop to its own stop; returns {trials, stop_reason, status, charging_check}. With `truth` (a profile
    YAML path or name) the sim target simulates that truth while the goal keeps its own `sim_profile` (the prior).
    With `prior` the twin starts from that profile instead (bench --prior derived: derived from the deployment).
    `twin`: the planner searches the goal's twin (None: $TUNELOOP_TWIN, agent.loop.session.twin_enabled)."""
    from agent.loop.session import run_session
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import Target
    from state.store import Store

    with tempfile.TemporaryDirectory(prefix="tuner-bench-", dir=workdir) as tmp:
        url = f"sqlite:///{Path(tmp) / 'tuneloop.db'}"
        store = Store(url)
        try:
            # run_session simulates the goal on its own sim_profile (executor.runner.Executor.bind_sim_profile), or
            # on the target's truth_profile where the bench set one (the goal never names it)
            targets = None if truth is None and prior is None else {
                goal.target: Target(name=goal.target, kind="sim", engine="sim", profile=goal.sim_profile,
                                    truth_profile=truth, twin_prior=prior)}
            ex = Executor(store, targets, settings=ExecSettings.from_env(runs_root=Path(tmp) / "runs"))
            res = run_session(goal, url, auto_approve=True, executor=ex, who="tuner-efficiency bench", twin=twin)
            trials, check = read_trials(store, res.goal_id, goal, profile, space)
        finally:
            store.close()
    return {"trials": trials, "stop_reason": res.reason, "status": res.status, "charging_check": check}


def read_trials(store: Any, goal_id: str, goal: Any, profile: Profile,
                space: dict[str, list[Any]]) -> tuple[list[Trial], dict[str, Any]]:
    """The loop's experiments in judged order, and the bench's re-charge of them (must agree)."""
    from agent.loop.record import card_of
    from core.trial import CostEntry
    from executor.targets import builtin_sim

    best = goal.start_station()
    trials: list[Trial] = []
    running: dict[str, Any] | None = None
    ours = theirs = 0.0
    seen: dict[str, bool] = {}
    last_run: str | None = None
    beaten = False  # a reference run sets the incumbent only until something beat the start (Store.best)
    for d in store.decisions(goal_id):
        data = d.data or {}
        if d.kind in BEST_KINDS and data.get("knobs") is not None and (d.kind != "baseline" or not beaten):
            best, beaten = dict(data["knobs"]), beaten or d.kind != "baseline"
            if trials and d.run_id == last_run:  # e.g. a quality evaluation passed after the judgement
                trials[-1] = trials[-1].model_copy(update={"incumbent": {k: best.get(k) for k in space},
                                                           "improved": True})
        if "outcome" not in data or d.run_id is None:
            continue
        res = store.get_result(d.run_id).result
        card = card_of(store.get_candidate(d.candidate_id).card)
        ev: Eval = of_summary(res.summary, res.verdict.kind, [r.code for r in res.verdict.reasons], goal)
        spec = store.get_run(d.run_id).spec
        full = full_knobs(spec["knobs"], "sim")
        mine = charge(profile.costs, running, full, ev.load_s, ev.cards) if res.summary else []
        if res.summary and spec.get("profile_capture"):  # a profile the diagnosis asked for is charged too
            mine.append(CostEntry(what="profile", seconds=builtin_sim().profiler_seconds, cards=ev.cards))
        running = full
        ours += sum(e.card_hours for e in mine)
        theirs += res.card_hours
        point = {k: card.knobs.get(k) for k in space}
        key = f"{sorted((k, repr(v)) for k, v in card.knobs.items())}@{card.n}"
        improved = data["outcome"] == "new_best"
        last_run = d.run_id
        repeated = key in seen and not seen[key]
        seen[key] = seen.get(key, False) or improved or data["outcome"] in ("reference", "promising")
        cum = (trials[-1].cum_card_hours if trials else 0.0) + res.card_hours
        trials.append(Trial(index=len(trials) + 1, knobs=point, stage=card.stage, n=card.n, verdict=ev.verdict,
                            objective=ev.objective, feasible=ev.feasible, card_hours=res.card_hours,
                            cum_card_hours=cum, restarted=any(c.what == "restart" for c in res.costs),
                            incumbent={k: best.get(k) for k in space}, improved=improved,
                            repeated_negative=repeated))
    check = {"executor_card_hours": round(theirs, 6), "bench_rule_card_hours": round(ours, 6),
             "agree": abs(ours - theirs) <= 1e-6 * max(1.0, theirs)}
    return trials, check
