"""Crash tests with real processes on the `local` target: `tuneloop sim serve` + the load generator,
launched detached through the launcher. The executor (a forked process) is SIGKILLed mid deploy,
mid load and at boundaries around the load; after resume the server's own request counter shows
exactly one load per run and every result matches an uncrashed reference."""
from __future__ import annotations

import asyncio
import os
import signal
import sys

import httpx
import pytest
from ports_support import free_port

from core.journal import as_record
from core.trial import PHASES, TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Target
from state.store import Store

SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 32\nseed: 7\n"
N, WARMUP = 16, 2
POINTS = ["deploy:mid", "health:before", "load:before", "load:mid", "load:after", "collect:before", "validate:before"]


def _counter(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("tuneloop_sim_requests_total")))


@pytest.fixture
def world(tmp_path):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    port = free_port()
    target = Target(name="loc", kind="local", engine="sim", run_root=str(tmp_path / "tgt"), time_scale=100.0,
                    tuneloop=(sys.executable, "-m", "tuneloop_cli"),
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=16, port=port),))
    settings = ExecSettings(runs_root=tmp_path / "runs", holder="crash:local", lease_ttl_s=60, poll_interval_s=0.05,
                            timeouts_s={"health": 60.0, "load": 120.0})

    def make() -> Executor:
        return Executor(Store(f"sqlite:///{tmp_path / 'state.db'}"), {"loc": target}, settings)
    yield make, str(tmp_path / "tiny.yaml"), port, target
    from executor.templates import ServiceSpec
    from executor.transports.local import LocalTransport

    svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("true",))
    asyncio.run(LocalTransport(target).stop_service(svc, 10**9))


def _spec(scenario: str, run_id: str) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target="loc", scenario=scenario, n=N, warmup=WARMUP, seed=1,
                     knobs={"concurrency": 4, "request_rate": "inf"})  # prefix caching on: flushed per run


def _crash(make, spec: TrialSpec, point: str) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ["TUNELOOP_CRASH_AT"] = point
            make().run_trial(spec)
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    return os.waitpid(pid, 0)[1]


def _same(a, b) -> None:
    assert a.verdict == b.verdict
    sa, sb = a.summary, b.summary
    for f in ("n_total", "n_formal", "n_sent", "n_ok", "n_failed", "cards", "concurrency", "output_len_min",
              "output_len_max", "cache_hit"):
        assert getattr(sa, f) == getattr(sb, f), f
    assert a.station_hash == b.station_hash


def test_crashes_resume_with_exactly_one_load_each(world):
    make, scenario, port, _ = world
    runs = []
    for i, point in enumerate(POINTS):  # deploy:mid first: only a cold start passes through deploy's middle
        spec = _spec(scenario, f"r{i}")
        status = _crash(make, spec, point)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"no crash at {point}"
        ex = make()
        before = [as_record(r) for r in ex.store.phases(spec.run_id)]
        (got,) = ex.resume_all()
        after = [as_record(r) for r in ex.store.phases(spec.run_id)]
        assert after[:len(before)] == before, point
        assert all(any(r.phase == ph and r.event == "outcome" and r.status == "ok" for r in after) for ph in PHASES)
        assert got.verdict.kind == "valid", (point, got.verdict, got.error)
        assert got.summary.cache_hit == 0.0, point  # zero-cache scenario on a warm service: the cache was flushed
        runs.append(got)
    ref = make().run_trial(_spec(scenario, "reference"))
    for got in runs:
        _same(got, ref)
    # the server's own counter: every run (and the reference) sent its requests exactly once
    assert _counter(port) == (len(POINTS) + 1) * (N + WARMUP)
    log = (make().targets["loc"].run_root + "/launch.log")
    text = open(log).read()
    assert text.count("start-service ") == 1  # warm service reused across all runs
    warm = [as_record(r) for r in make().store.phases("reference")]
    flush = next(r.detail for r in warm if r.phase == "warmup" and r.event == "outcome")["cache_flush"]
    assert flush == [{"service": "sim-0", "method": "POST /reset_prefix_cache", "status": 200, "ok": True}]
    for i in range(len(POINTS)):
        assert text.count(f"start-run r{i}.load ") == 1
