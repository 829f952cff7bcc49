"""Progress in one clock (issue 36 item 5): on the simulator the requests counter moves while the simulated load
runs (the simulation is the launch itself, so the runner counts while it launches), and elapsed time is the
simulator's device seconds beside the planner's device-time estimate, never the wall's; a real target keeps the
wall's clock."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone

from core import profiles, scenarios
from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.transports.sim import SimTransport
from simulator import engine
from state.store import Store
from test_exec_runner import SCENARIO  # the tiny copy scenario the executor's tests run


def test_the_simulation_reports_requests_done_and_its_virtual_clock_as_it_goes(tmp_path):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    seen: list[tuple[int, float]] = []
    run = engine.simulate(profiles.load("dsv4-flash-910c-p8d8"), scenarios.load(str(tmp_path / "tiny.yaml")),
                          {"concurrency": 8, "request_rate": 4.0}, 60, warmup=4, seed=1,
                          on_progress=lambda done, t: seen.append((done, t)))
    assert len(seen) > 10  # many notes, not one at the end
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and [t for _, t in seen] == sorted(t for _, t in seen)
    assert seen[-1][0] == len(run.records) == 64  # the warm-up requests count: N plus warm-up is the total shown
    assert seen[0][1] > 0 and seen[-1][1] >= 60 / 4.0 * 0.9  # virtual seconds: 60 requests at 4 per second


class PausedHalfway(SimTransport):
    """The simulator, held still once half the load completed until the test saw the count the runner noted."""

    PROGRESS_EVERY_S = 0.0
    release = threading.Event()
    half = 0

    def _note(self, run_dir, done, t):
        super()._note(run_dir, done, t)
        if self.half and done >= self.half and not self.release.is_set():
            assert self.release.wait(120), "the test never saw the running count"


def test_a_simulated_load_shows_its_count_moving_and_its_simulated_clock(tmp_path):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    PausedHalfway.half, total = 100, 200
    PausedHalfway.release.clear()
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    ex = Executor(store, settings=ExecSettings(runs_root=tmp_path / "runs", holder="t:ex", lease_ttl_s=60),
                  transports=lambda target, root: PausedHalfway(target, root=root / "_targets" / target.name))
    spec = TrialSpec.model_validate(dict(run_id="long", goal_id="g", target="sim", scenario=str(tmp_path / "tiny.yaml"),
                                         n=total, seed=3, knobs={"concurrency": 8, "request_rate": "inf"}))
    note = tmp_path / "runs" / "long" / "progress.json"
    seen: dict = {}

    def watch() -> None:  # what GET /goals/G reads while the load runs
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not PausedHalfway.release.is_set():
            try:
                data = json.loads(note.read_text())
            except (OSError, ValueError):
                data = {}
            if (data.get("requests_done") or 0) >= PausedHalfway.half:
                seen.update(data)
                PausedHalfway.release.set()
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        r = ex.run_trial(spec)
    finally:
        PausedHalfway.release.set()
        t.join()
        store.close()
    assert r.verdict.kind == "valid", r.verdict
    assert PausedHalfway.half <= seen["requests_done"] < total and seen["requests_total"] == total  # moving, not 0
    assert seen["clock"] == "simulated" and seen["load_s"] > 0
    # the device seconds the simulator charges so far: the restart's fixed costs plus the load's virtual time
    restart = sum(c.seconds for c in r.costs if c.what != "load")
    assert seen["elapsed_s"] == round(restart + seen["load_s"], 3) and restart > 0
    final = json.loads(note.read_text())
    assert final["requests_done"] == total and final["load_s"] >= seen["load_s"]


def _progress_goal(tmp_path, clock: str):
    """A goal with one run in its load phase, as the runner leaves it (phase records, progress.json)."""
    from test_api_support import small_goal

    from agent.planner.candidates import build_card
    from agent.loop.record import card_record
    from state.goal import GoalSpec

    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    goal = store.create_goal(GoalSpec.model_validate(small_goal("clock-goal")))
    spec = goal.spec
    card = build_card(goal.id, spec.scenario, spec.start_station(), "concurrency", 90, stage="screen", n=40)
    cand = store.add_candidate(goal.id, card_record(card))
    run = TrialSpec(run_id=card.run_id(), goal_id=goal.id, target="sim", scenario=spec.scenario, knobs=card.knobs,
                    stage="screen", n=40, warmup=8)
    store.create_run(run, candidate_id=cand.id)
    store.set_run_status(run.run_id, "running")
    epoch = store.acquire_lease("sim", "test", 60)
    store.record_phase(run.run_id, "prepare", "intent", "started", epoch=epoch, target="sim")
    store.record_phase(run.run_id, "prepare", "outcome", "ok", epoch=epoch, target="sim", detail={"clock": clock})
    return store, goal.id, run.run_id, epoch


def test_progress_on_the_simulator_is_in_simulated_seconds_on_a_real_target_in_wall_seconds(tmp_path):
    from agent.loop.progress import goal_progress

    later = datetime.now(timezone.utc) + timedelta(hours=3)  # three wall hours on: never shown on the simulator
    for clock in ("simulated", "wall"):
        d = tmp_path / clock
        d.mkdir()
        store, gid, rid, epoch = _progress_goal(d, clock)
        try:
            p = goal_progress(store, gid, d / "runs", now=later)
            assert p.clock == clock and p.expected_s > 0
            if clock == "simulated":
                assert p.elapsed_s is None  # before its load noted anything: no figure, not the wall's
            else:
                assert p.elapsed_s >= 3 * 3600 - 5
            store.record_phase(rid, "load", "intent", "started", epoch=epoch, target="sim")
            (d / "runs" / rid).mkdir(parents=True)
            (d / "runs" / rid / "progress.json").write_text(json.dumps(
                {"requests_done": 21, "requests_total": 48, "clock": clock, "load_s": 30.0, "elapsed_s": 990.0}
                if clock == "simulated" else {"requests_done": 21, "requests_total": 48, "clock": "wall"}))
            p = goal_progress(store, gid, d / "runs", now=later)
            assert (p.requests_done, p.requests_total) == (21, 48)
            if clock == "simulated":
                assert p.elapsed_s == 990.0 and "simulated 990 s of ~" in p.line()
            else:
                assert p.elapsed_s >= 3 * 3600 - 5 and "wall 10" in p.line()
        finally:
            store.close()
