"""SIGKILL the executor (a real forked process) at every phase boundary and mid deploy / mid load,
then resume in a fresh executor: one load, no record lost, results equal to an uncrashed run."""
from __future__ import annotations

import os
import signal

import pytest

from core.journal import as_record
from core.trial import PHASES, TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from state.store import Store

SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 512\noutput_len: 64\nseed: 7\n"
POINTS = (["lock:after", "lock:done"]
          + [f"{ph}:{w}" for ph in ("prepare", "deploy", "health", "warmup", "load", "collect", "validate")
             for w in ("before", "after", "done")]
          + ["deploy:mid", "load:mid", "release:before"])


def _spec(scenario: str, run_id: str) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target="sim", scenario=scenario, n=30, seed=5,
                     knobs={"concurrency": 8, "request_rate": 40.0, "max_num_seqs": 64})


def _executor(tmp_path, name: str) -> Executor:
    return Executor(Store(f"sqlite:///{tmp_path / f'{name}.db'}"),
                    settings=ExecSettings(runs_root=tmp_path / name, holder="crash:ex", lease_ttl_s=30))


def _run_and_die(tmp_path, spec: TrialSpec, point: str) -> int:
    pid = os.fork()
    if pid == 0:  # the child: a real executor process that kills itself at the crash point
        code = 0
        try:
            os.environ["TUNELOOP_CRASH_AT"] = point
            _executor(tmp_path, "crashy").run_trial(spec)
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    (tmp / "tiny-copy.yaml").write_text(SCENARIO)
    ex = _executor(tmp, "ref")
    return str(tmp / "tiny-copy.yaml"), ex.run_trial(_spec(str(tmp / "tiny-copy.yaml"), "run"))


@pytest.mark.parametrize("point", POINTS)
def test_crash_then_resume_equals_reference(tmp_path, reference, point):
    scenario, ref = reference
    spec = _spec(scenario, "run")
    status = _run_and_die(tmp_path, spec, point)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"no crash at {point}: {status}"
    ex = _executor(tmp_path, "crashy")
    before = [as_record(r) for r in ex.store.phases("run")]
    results = ex.resume_all()
    assert [r.run_id for r in results] == ["run"]
    got = results[0]
    after = [as_record(r) for r in ex.store.phases("run")]
    assert after[:len(before)] == before  # nothing written before the crash was lost
    for ph in PHASES:
        assert any(r.phase == ph and r.event == "outcome" and r.status == "ok" for r in after), ph
    log = (ex.root / "_targets" / "sim" / "launch.log").read_text()
    assert log.count("start-run run.load ") == 1  # exactly one load
    assert got.verdict == ref.verdict and got.summary == ref.summary
    assert got.station_hash == ref.station_hash and got.evidence.model_fields_set == ref.evidence.model_fields_set != set()
    assert ex.resume_all() == []  # finished: nothing left to resume
    assert ex.run_trial(spec) == got
