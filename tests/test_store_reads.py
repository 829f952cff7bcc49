"""Store reads per loop iteration do not grow with the number of past decisions: the history is built once per
iteration (and with one read of the results, not one per decision), and the diagnosis once per history."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from agent.planner import deterministic as planner_mod
from agent.loop import record
from agent.loop.session import run_session
from executor.phases import ExecSettings
from executor.runner import Executor
from state.goal import load_goal
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _public_methods(cls) -> list[str]:
    return sorted({n for k in cls.__mro__ if k.__module__.startswith("state.") for n, v in vars(k).items()
                   if callable(v) and not n.startswith("_")})


@pytest.fixture
def counted(monkeypatch):
    """Every call of a Store method, tagged with the loop iteration it fell in (iterations start at observe)."""
    calls: list[tuple[int, str]] = []
    iteration = [0]
    for name in _public_methods(Store):
        orig = getattr(Store, name)

        @functools.wraps(orig)
        def wrapper(self, *a, __orig=orig, __name=name, **kw):
            calls.append((iteration[0], __name))
            return __orig(self, *a, **kw)
        monkeypatch.setattr(Store, name, wrapper)
    builds = [0]
    orig_build = record.build_history

    def counting_build(*a, **kw):
        builds[0] += 1
        return orig_build(*a, **kw)
    monkeypatch.setattr("agent.loop.nodes.build_history", counting_build)
    diagnoses = [0]
    orig_diag = planner_mod._diagnose

    def counting_diag(h):
        diagnoses[0] += 1
        return orig_diag(h)
    monkeypatch.setattr(planner_mod, "_diagnose", counting_diag)
    return calls, iteration, builds, diagnoses


def test_reads_per_iteration_do_not_grow_with_past_decisions(tmp_path, counted):
    calls, iteration, builds, diagnoses = counted
    spec = load_goal(ROOT / "examples" / "goal-16k.yaml")
    url = f"sqlite:///{tmp_path / 'reads.db'}"
    ex = Executor(Store(url), settings=ExecSettings(runs_root=tmp_path / "runs"))
    events: list[tuple[int, str, dict]] = []

    def on_event(phase: str, info: dict) -> None:
        if phase == "observe":
            iteration[0] += 1
        events.append((iteration[0], phase, info))
    calls.clear()
    # the rules' 8-experiment trajectory: long enough for a path to repeat early and late; the twin's (on by default)
    # stops after 4 experiments, none on a repeated path
    run_session(spec, url, auto_approve=True, executor=ex, new_goal=True, on_event=on_event, twin=False)
    judged = {i: info.get("outcome") for i, phase, info in events if phase == "judge"}
    stages = {i: (info.get("card") or {}).get("stage") for i, phase, info in events if phase == "propose"}
    reads = {i: sum(1 for j, _ in calls if j == i) for i in judged}
    iterations = sorted(judged)[1:]  # from the second on: the first has no decision before it at all
    assert len(iterations) >= 6, judged
    assert builds[0] <= len(iterations) + 2  # once per iteration (plus the final observe's stop)
    assert diagnoses[0] <= builds[0]  # the diagnose node and the planner share one diagnosis per history
    # iterations that took the same path read the store the same number of times, early or late
    paths: dict[tuple, list[int]] = {}
    for i in iterations:
        paths.setdefault((stages.get(i), judged[i]), []).append(i)
    repeated = {p: [reads[i] for i in its] for p, its in paths.items() if len(its) > 1}
    assert repeated, f"no path ran twice: {paths}"
    for path, counts in repeated.items():
        assert len(set(counts)) == 1, f"{path}: reads per iteration {counts} grew with the decisions before them"


def test_the_planner_plans_from_the_diagnosis_the_graph_state_carries(tmp_path, counted, monkeypatch):
    """The diagnose node's Diagnosis travels in the graph state: a History rebuilt between diagnose and propose
    (as after a restart between the two) is not diagnosed again, and the loop decides what it decides anyway."""
    from agent.loop.nodes import Loop

    _, _, _, diagnoses = counted
    spec = load_goal(ROOT / "examples" / "goal-16k.yaml")

    def run(tag: str) -> tuple[list[str], int, int]:
        url = f"sqlite:///{tmp_path / f'{tag}.db'}"
        ex = Executor(Store(url), settings=ExecSettings(runs_root=tmp_path / f"runs-{tag}"))
        events: list[tuple[str, dict]] = []
        diagnoses[0] = 0
        res = run_session(spec, url, auto_approve=True, executor=ex, new_goal=True,
                          on_event=lambda phase, info: events.append((phase, info)))
        decided = [d.text for d in Store(url).decisions(res.goal_id)]
        return decided, sum(1 for p, _ in events if p == "diagnose"), diagnoses[0]

    plain, n_diag, computed = run("plain")
    assert computed == n_diag  # one diagnosis per iteration, shared by diagnose and propose
    orig = Loop.propose

    def propose_after_restart(self, state):
        self._history = None  # the History is rebuilt from the store, as a restarted process would
        return orig(self, state)
    monkeypatch.setattr(Loop, "propose", propose_after_restart)
    rebuilt, n_diag2, computed2 = run("rebuilt")
    assert computed2 == n_diag2  # not diagnosed again: propose took the one the state carried
    assert [t.split(" (")[0] for t in rebuilt] == [t.split(" (")[0] for t in plain]
