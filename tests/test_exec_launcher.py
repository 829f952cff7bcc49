"""The target-side launcher through the local transport: claims, fencing, markers, services."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from executor.targets import Host, Target
from executor.templates import ServiceSpec
from executor.transports.base import AlreadyClaimed, StaleLaunch
from executor.transports.local import LocalTransport


def _target(root: Path) -> Target:
    return Target(name="loc", kind="local", engine="sim", run_root=str(root / "tgt"),
                  hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=1),))


async def _wait_done(t: LocalTransport, key: str):
    for _ in range(400):
        m = await t.poll(key)
        if m.done:
            return m
        await asyncio.sleep(0.025)
    raise AssertionError(f"{key} never finished: {m}")


async def test_run_claim_markers_and_rc(tmp_path):
    t = LocalTransport(_target(tmp_path))
    assert (await t.poll("r1")).claimed is False
    pid = await t.launch_argv("r1", ["sh", "-c", "echo hi > out/x; exit 3"], epoch=1)
    assert pid > 0
    m = await _wait_done(t, "r1")
    assert (m.claimed, m.rc, m.epoch) == (True, 3, 1)
    assert (Path(t.root) / "runs/r1/out/x").read_text() == "hi\n"
    with pytest.raises(AlreadyClaimed):
        await t.launch_argv("r1", ["true"], epoch=1)
    log = await t.launch_log()
    assert "start-run r1 epoch=1" in log and "end-run r1 epoch=1 rc=3" in log
    assert "refused run r1 epoch=1 already-claimed" in log


async def test_stale_epoch_refused_and_logged(tmp_path):
    t = LocalTransport(_target(tmp_path))
    await t.fence(5)
    with pytest.raises(StaleLaunch, match="stale epoch: 4 < 5"):
        await t.launch_argv("r2", ["true"], epoch=4)
    assert (await t.poll("r2")).claimed is False  # refused before the claim
    with pytest.raises(StaleLaunch):
        await t.start_service(ServiceSpec(name="s", role="mixed", host="h", port=1, argv=("true",)), "abc", 3)
    assert "refused run r2 epoch=4 current=5" in await t.launch_log()


async def test_detached_run_survives_and_argv_is_byte_exact(tmp_path):
    """Metacharacters in argv arrive as one argument each and are never executed."""
    t = LocalTransport(_target(tmp_path))
    evil = ["a b", "$(touch pwned)", "`touch pwned2`", "x;touch pwned3", "'\"", "|&<>*?"]
    dump = "import json,sys; json.dump(sys.argv[1:], open('out/argv.json','w'))"
    await t.launch_argv("r3", [sys.executable, "-c", dump, *evil], epoch=1)
    await _wait_done(t, "r3")
    run_dir = Path(t.root) / "runs/r3"
    assert json.loads((run_dir / "out/argv.json").read_text()) == evil
    assert not list(run_dir.rglob("pwned*")) and not list(Path(t.root).rglob("pwned*"))


async def test_service_restart_replaces_process_and_records_station(tmp_path):
    t = LocalTransport(_target(tmp_path))
    svc = ServiceSpec(name="svc0", role="mixed", host="127.0.0.1", port=1, argv=("sleep", "300"),
                      files={"conf.json": '{"a": 1}'}, env={"FOO": "bar"})
    await t.start_service(svc, "hash1", 1)
    s1 = await t.service_state(svc)
    assert s1.alive and s1.station == "hash1"
    assert (Path(t.root) / "svc/svc0/conf.json").read_text() == '{"a": 1}'
    await t.start_service(svc, "hash2", 2)
    s2 = await t.service_state(svc)
    assert s2.alive and s2.station == "hash2" and s2.pid != s1.pid
    await t.stop_service(svc, 2)
    s3 = await t.service_state(svc)
    assert not s3.alive and s3.station is None


# -- the fence fails closed -------------------------------------------------------------------------------
def _launch(root: Path, epoch: str, *args: str, path: str | None = None):
    import os
    import subprocess

    from executor.launcher import SCRIPT

    script = root / "launcher.sh"
    script.write_text(SCRIPT)
    env = dict(os.environ) if path is None else {"PATH": path}
    return subprocess.run(["/bin/sh", str(script), str(root / "tgt"), epoch, *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("content", ["", "\n", "garbage\n", "12abc\n", "-3\n"])
def test_an_empty_or_garbage_epoch_file_is_refused_named(tmp_path, content):
    from executor.launcher import BAD_EPOCH_RC

    (tmp_path / "tgt").mkdir()
    (tmp_path / "tgt" / "epoch").write_text(content)
    r = _launch(tmp_path, "7", "run", "k1", "--", "touch", str(tmp_path / "ran"))
    assert r.returncode == BAD_EPOCH_RC and "bad epoch file" in r.stderr and "epoch is empty or not a number" in r.stderr
    assert not (tmp_path / "tgt" / "runs" / "k1").exists() and not (tmp_path / "ran").exists()
    assert (tmp_path / "tgt" / "epoch").read_text() == content  # left as it was for a person to look at
    assert "refused run k1 epoch=7 bad-epoch-file" in (tmp_path / "tgt" / "launch.log").read_text()
    r = _launch(tmp_path, "7", "fence")
    assert r.returncode == BAD_EPOCH_RC


@pytest.mark.parametrize("epoch", ["", "x", "1.5", "-1"])
def test_a_missing_or_non_numeric_caller_epoch_is_refused(tmp_path, epoch):
    from executor.launcher import BAD_EPOCH_RC

    r = _launch(tmp_path, epoch, "run", "k1", "--", "touch", str(tmp_path / "ran"))
    assert r.returncode == BAD_EPOCH_RC and "bad epoch" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_a_fresh_target_starts_at_epoch_zero_and_a_good_file_still_fences(tmp_path):
    r = _launch(tmp_path, "3", "fence")
    assert r.returncode == 0 and (tmp_path / "tgt" / "epoch").read_text() == "3\n"
    r = _launch(tmp_path, "2", "fence")
    assert r.returncode == 75 and "stale epoch: 2 < 3" in r.stderr


def test_without_flock_every_locked_action_is_refused(tmp_path):
    import shutil

    from executor.launcher import NO_FLOCK_RC

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "date", "cat", "tr", "setsid", "nohup", "sh", "kill", "ps", "mv", "rm", "sleep", "touch"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    assert shutil.which("flock", path=str(bin_dir)) is None
    r = _launch(tmp_path, "1", "run", "k1", "--", "touch", str(tmp_path / "ran"), path=str(bin_dir))
    assert r.returncode == NO_FLOCK_RC and "no flock on this target" in r.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "tgt" / "runs" / "k1").exists()
    for action in (["fence"], ["stop", "svc0"], ["service", "svc0", "h", "--", "true"]):
        assert _launch(tmp_path, "1", *action, path=str(bin_dir)).returncode == NO_FLOCK_RC
    assert _launch(tmp_path, "1", "poll", "k1", path=str(bin_dir)).stdout.strip() == "claimed=0"  # reads need no lock


def test_a_command_that_ends_as_its_timeout_fires_is_a_transient_not_a_crash(tmp_path, monkeypatch):
    """The race a loaded machine hit (CI: a launcher poll beside a real vLLM): the timeout fires, and by the kill the
    process has already ended and its transport closed. That is a Transient (the poll is retried), never
    ProcessLookupError out of the trial."""
    import executor.transports.local as local
    from executor.transports.base import Transient

    real = asyncio.wait_for

    async def ends_then_times_out(aw, timeout):
        await real(aw, timeout)  # the command ran to its end ...
        raise asyncio.TimeoutError  # ... as its timeout fired

    monkeypatch.setattr(local.asyncio, "wait_for", ends_then_times_out)
    tr = LocalTransport(_target(tmp_path))
    with pytest.raises(Transient, match="timed out after 5s"):
        asyncio.run(tr.run(["true"], timeout=5))
