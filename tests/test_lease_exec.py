"""Fenced leases with real processes: two executors on one target never overlap; a holder paused
(SIGSTOP) past its lease has its late launch and its late journal writes refused. On SQLite and PostgreSQL."""
from __future__ import annotations

import os
import signal
import time

from core.journal import as_record, is_stale_epoch
from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.transports.base import StaleLaunch
from state.store import Store

SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 32\nseed: 7\n"


def _ex(tmp_path, holder: str, ttl: float = 30.0, url: str | None = None) -> Executor:
    return Executor(Store(url or f"sqlite:///{tmp_path / 'state.db'}"),
                    settings=ExecSettings(runs_root=tmp_path / "runs", holder=holder, lease_ttl_s=ttl))


def _spec(scenario: str, run_id: str, c: int = 4) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target="sim", scenario=scenario, n=12, seed=1,
                     knobs={"concurrency": c, "request_rate": "inf"})


def test_two_executors_over_20_runs_never_overlap(tmp_path, store_url):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    _ex(tmp_path, "init", url=store_url)  # create the schema once, before two processes race to
    pids = []
    for who in ("A", "B"):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ex = _ex(tmp_path, f"holder-{who}", url=store_url)
                for i in range(10):  # alternate stations so some runs restart and some reuse
                    assert ex.run_trial(_spec(str(tmp_path / "s.yaml"), f"{who}{i}", c=4 + i % 2)).verdict.kind == "valid"
            except BaseException as e:  # noqa: BLE001
                print(f"{who}: {e!r}")
                code = 1
            os._exit(code)
        pids.append(pid)
    assert all(os.waitpid(p, 0)[1] == 0 for p in pids)
    log = (tmp_path / "runs" / "_targets" / "sim" / "launch.log").read_text().splitlines()
    events = [(float(l.split()[0]), l.split()[1], l.split()[2], int(l.split()[3].split("=")[1]))
              for l in log if l.split()[1] in ("begin-run", "end-run")]
    assert len([e for e in events if e[1] == "end-run"]) == 20
    open_run = None
    last_epoch = 0
    for t, kind, key, epoch in sorted(events):
        if kind == "begin-run":
            assert open_run is None, f"{key} began while {open_run} was running"
            assert epoch > last_epoch  # each run under a newer lease than the one before
            open_run, last_epoch = key, epoch
        else:
            assert open_run == key
            open_run = None
    # both executors really took turns on the target
    holders = {key[0] for _, kind, key, _ in events}
    assert holders == {"A", "B"}


def test_paused_holder_past_its_lease_is_fenced(tmp_path, store_url):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    mark = tmp_path / "paused"
    _ex(tmp_path, "init", url=store_url)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.environ.update(TUNELOOP_CRASH_AT="load:before", TUNELOOP_CRASH_SIGNAL="STOP", TUNELOOP_CRASH_MARK=str(mark))
        ex = _ex(tmp_path, "holder-A", ttl=1.0, url=store_url)
        verdict = "no-error"
        try:
            ex.run_trial(_spec(str(tmp_path / "s.yaml"), "late"))
        except StaleLaunch as e:
            verdict = f"launch-refused:{e}"
        except BaseException as e:  # noqa: BLE001
            verdict = f"other:{e!r}"
        try:  # a late journal write with the old epoch
            ex.store.record_phase("late", "load", "outcome", "ok", epoch=1, target="sim")
            verdict += "|write-accepted"
        except Exception as e:  # noqa: BLE001
            verdict += "|write-refused" if is_stale_epoch(e) else f"|write-error:{e!r}"
        os.write(w, verdict.encode())
        os._exit(0)
    os.close(w)
    while not mark.exists():  # the child announces its pause through this file, then stops itself
        time.sleep(0.02)
    assert os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1])  # really paused, holding epoch 1
    b = _ex(tmp_path, "holder-B", ttl=30.0, url=store_url)
    got = b.run_trial(_spec(str(tmp_path / "s.yaml"), "fresh"))  # waits out A's 1 s lease, then takes over
    assert got.verdict.kind == "valid"
    os.kill(pid, signal.SIGCONT)
    out = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert out.startswith("launch-refused:stale epoch: 1 < 2"), out
    assert out.endswith("|write-refused"), out
    recs = [as_record(x) for x in b.store.phases("late")]
    assert [(x.phase, x.event) for x in recs][-1] == ("load", "intent")  # nothing after the pause got in
    log = (tmp_path / "runs" / "_targets" / "sim" / "launch.log").read_text()
    assert "refused late.load epoch=1 current=2" in log and "start-run late.load" not in log
