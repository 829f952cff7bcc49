"""Relayout on a real (local) target: the target declares collect / fit steps and how the engines load
the layout. They run as detached launcher runs with markers, once each even across an executor crash,
then the engine restarts with the layout; the time is charged as relayout; a failing step is an
orchestration fault with its own output."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import httpx
import pytest
from ports_support import free_port

from core.journal import as_record
from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Relayout, Target
from state.store import Store

SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 16\nseed: 7\n"
PY = sys.executable
COLLECT = (PY, "-c", "import json,sys; json.dump({'expert_load': [5, 1, 1, 1]}, open(sys.argv[1], 'w'))", "{stats}")
FIT = (PY, "-c", "import json,sys; s=json.load(open(sys.argv[1])); "
       "json.dump({'placement': sorted(range(4), key=lambda e: -s['expert_load'][e])}, open(sys.argv[2], 'w'))",
       "{stats}", "{layout}")


@pytest.fixture
def world(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    port = free_port()

    def target(fit=FIT) -> Target:  # the sim server "loads" the layout as its model id: /v1/models shows it
        return Target(name="loc", kind="local", engine="sim", run_root=str(tmp_path / "tgt"), time_scale=100.0,
                      tuneloop=(PY, "-m", "tuneloop_cli"), relayout=Relayout(collect=COLLECT, fit=fit,
                                                                             load=("--model", "{layout}")),
                      hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=16, port=port),))

    def make(t: Target | None = None) -> Executor:
        return Executor(Store(f"sqlite:///{tmp_path / 'state.db'}"), {"loc": t or target()},
                        ExecSettings(runs_root=tmp_path / "runs", holder="relayout", poll_interval_s=0.05,
                                     timeouts_s={"health": 60.0, "load": 120.0}))
    yield make, target, tmp_path, port
    from executor.templates import ServiceSpec
    from executor.transports.local import LocalTransport

    svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("true",))
    asyncio.run(LocalTransport(target()).stop_service(svc, 10**9))


def _spec(tmp_path, run_id: str, layout: str) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target="loc", scenario=str(tmp_path / "s.yaml"), n=8, seed=1,
                     knobs={"concurrency": 4, "request_rate": "inf", "expert_layout": layout})


def _deploy(ex: Executor, run_id: str):
    return next(r.detail for r in map(as_record, ex.store.phases(run_id))
                if r.phase == "deploy" and r.event == "outcome" and r.status == "ok")


def test_relayout_steps_run_detached_once_and_the_engine_loads_the_layout(world):
    make, _, tmp, port = world
    assert make().run_trial(_spec(tmp, "dyn", "none")).verdict.kind == "valid"
    pid = os.fork()  # an executor that dies in the middle of the relayout's deploy
    if pid == 0:
        try:
            os.environ["TUNELOOP_CRASH_AT"] = "deploy:mid"
            make().run_trial(_spec(tmp, "eplb", "static_eplb"))
        except BaseException as e:  # noqa: BLE001 - reported through the exit status
            print(f"child: {e!r}", flush=True)
        os._exit(2)
    status = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    ex = make()
    (r,) = ex.resume_all()
    assert r.verdict.kind == "valid", (r.verdict, r.error)
    dep = _deploy(ex, "eplb")
    assert dep["cost_class"] == "relayout"
    assert [s["name"] if isinstance(s, dict) else s for s in dep["relayout_steps"]] == ["collect", "fit", "load_layout"]
    log = (tmp / "tgt" / "launch.log").read_text()
    assert log.count("start-run eplb.relayout-collect ") == 1 and log.count("start-run eplb.relayout-fit ") == 1
    layout = next((tmp / "tgt" / "layout").glob("*.layout.json"))
    assert json.loads(layout.read_text()) == {"placement": [0, 1, 2, 3]}
    served = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
    assert served == str(layout)  # the restarted engine was given the layout
    relayout = [c for c in r.costs if c.what == "relayout"]
    assert len(relayout) == 1 and relayout[0].seconds > 0


def test_a_failing_relayout_step_is_an_orchestration_fault_with_its_output(world):
    make, target, tmp, _ = world
    bad = target(fit=(PY, "-c", "import sys; sys.exit('fit: no expert statistics in {stats}')"))
    r = make(bad).run_trial(_spec(tmp, "bad", "static_eplb"))
    assert r.verdict.kind == "orchestration_fault" and r.verdict.reasons[0].code == "relayout_failed"
    assert "fit: no expert statistics in" in r.error and r.failed_phase == "deploy"
    assert "start-run bad.load" not in (tmp / "tgt" / "launch.log").read_text()
