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
