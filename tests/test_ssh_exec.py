"""The ssh transport against a real OpenSSH sshd on 127.0.0.1 that this test starts (own host key,
own port, authorized key): a connection dropped mid-load, a changed host key, byte-exact argv."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from ports_support import free_port
from unavailable import missing

from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, SshOptions, Target
from state.store import Store

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 32\nseed: 7\n"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(f"{path}.pub").read_text().strip()


def _start_sshd(d: Path, client_pub: str) -> dict:
    """One OpenSSH sshd on 127.0.0.1 with its own host key and port, trusting `client_pub`."""
    d.mkdir()
    host_pub = _keygen(d / "host_key")
    (d / "authorized_keys").write_text(client_pub + "\n")
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    Path("/run/sshd").mkdir(exist_ok=True)
    (d / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
AuthorizedKeysFile {d / 'authorized_keys'}
PidFile {d / 'sshd.pid'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
LogLevel INFO
Subsystem sftp internal-sftp
""")
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.02)  # waiting for a server socket to open
    else:  # never listened: a test that went on would pass or fail for the wrong reason
        proc.kill()
        log.close()
        raise AssertionError(f"sshd never listened on 127.0.0.1:{port} (exit {proc.wait()}): "
                             f"{(d / 'sshd.log').read_text()[-2000:]}")
    return {"port": port, "host_pub": host_pub, "dir": d, "proc": proc, "log": log}


def _stop_sshd(s: dict) -> None:
    s["proc"].terminate()
    s["proc"].wait(timeout=10)
    s["log"].close()


@pytest.fixture
def sshd(tmp_path):
    if not os.path.exists(SSHD):
        missing("sshd is not installed (make test installs openssh-server)")
    client_pub = _keygen(tmp_path / "client_key")
    s = _start_sshd(tmp_path / "sshd", client_pub)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{s['port']} {s['host_pub']}\n")
    yield {"port": s["port"], "known_hosts": str(kh), "key": str(tmp_path / "client_key"), "dir": s["dir"],
           "proc": s["proc"], "start": lambda name: _start_sshd(tmp_path / name, client_pub)}
    _stop_sshd(s)


def _target(tmp_path, sshd, svc_port: int, time_scale: float = 100.0) -> Target:
    return Target(name="cl", kind="ssh", engine="sim", run_root=str(tmp_path / "remote"), time_scale=time_scale,
                  tuneloop=(sys.executable, "-m", "tuneloop_cli"),
                  ssh=SshOptions(port=sshd["port"], known_hosts=sshd["known_hosts"], client_keys=(sshd["key"],),
                                 keepalive_interval=1.0, keepalive_count_max=2, reconnect_attempts=8),
                  hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=16, port=svc_port),))


def _stop(target: Target, port: int) -> None:
    from executor.templates import ServiceSpec
    from executor.transports.local import LocalTransport

    local = target.model_copy(update={"kind": "local", "ssh": None})
    asyncio.run(LocalTransport(local).stop_service(ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port,
                                                               argv=("true",)), 10**9))


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


def test_connection_dropped_mid_load_reconnects_and_collects(tmp_path, sshd):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    port = free_port()
    target = _target(tmp_path, sshd, port, time_scale=8.0)
    ex = Executor(Store(f"sqlite:///{tmp_path / 'state.db'}"), {"cl": target},
                  ExecSettings(runs_root=tmp_path / "runs", holder="ssh:ex", poll_interval_s=0.1,
                               timeouts_s={"health": 60.0, "load": 120.0}))
    spec = TrialSpec(run_id="s1", goal_id="g", target="cl", scenario=str(tmp_path / "s.yaml"), n=24, seed=1,
                     knobs={"concurrency": 4, "request_rate": "inf"})
    box = {}
    th = threading.Thread(target=lambda: box.update(r=ex.run_trial(spec)))
    th.start()
    try:
        pid_file = tmp_path / "remote" / "runs" / "s1.load" / "pid"
        while not pid_file.exists() and th.is_alive():
            time.sleep(0.02)  # waiting for the remote load to be launched
        assert pid_file.exists()
        for child in _children(sshd["proc"].pid):  # drop every live connection; the listener stays up
            os.kill(child, signal.SIGKILL)
        assert not (tmp_path / "remote" / "runs" / "s1.load" / "done").exists()  # the drop really was mid-load
        th.join(120)
        r = box["r"]
        assert r.verdict.kind == "valid", (r.verdict, r.error)
        assert r.summary.n_ok == 24
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert "tuneloop_sim_requests_total 24" in text  # the detached load ran once, to the end
        log = (sshd["dir"] / "sshd.log").read_text()
        assert log.count("Accepted publickey") >= 2  # the executor reconnected
    finally:
        th.join(120)
        _stop(target, port)


def test_changed_host_key_is_refused_with_a_clear_error(tmp_path, sshd):
    other = _keygen(tmp_path / "other_key")
    Path(sshd["known_hosts"]).write_text(f"[127.0.0.1]:{sshd['port']} {other}\n")
    from executor.transports.ssh import HostKeyRefused, SshTransport

    t = SshTransport(_target(tmp_path, sshd, 1))
    with pytest.raises(HostKeyRefused, match="host key does not match"):
        asyncio.run(t.run(["true"]))
    assert t.connects == 0


def test_metacharacters_arrive_byte_exact_over_ssh(tmp_path, sshd):
    from executor.transports.ssh import SshTransport

    evil = ["a b", "$(touch pwned)", "`touch pwned2`", "x;touch pwned3", "'\"", "|&<>*?", "\\n"]
    dump = "import json,sys; json.dump(sys.argv[1:], open('out/argv.json','w'))"

    async def go():
        t = SshTransport(_target(tmp_path, sshd, 1))
        await t.launch_argv("m1", [sys.executable, "-c", dump, *evil], epoch=1)
        for _ in range(500):
            if (await t.poll("m1")).done:
                break
            await asyncio.sleep(0.02)
        await t.fetch("m1", tmp_path / "fetched")
        await t.close()
    asyncio.run(go())
    assert json.loads((tmp_path / "fetched" / "argv.json").read_text()) == evil
    assert not list(tmp_path.rglob("pwned*")) and not list(Path.home().glob("pwned*"))


def test_two_hosts_services_and_loads_each_on_their_own_host(tmp_path, sshd):
    """Two "hosts" = two sshd on 127.0.0.1 (reached as 127.0.0.1 and as localhost) with their own ports and
    run roots: the engine lives on the serving host, the load, its markers and the SFTP fetch on the load
    host, health is probed on the serving host over SSH, and both hosts are fenced."""
    second = sshd["start"]("sshd2")
    port = free_port()
    target = None
    try:
        with open(sshd["known_hosts"], "a") as f:
            f.write(f"[localhost]:{second['port']} {second['host_pub']}\n")
        (tmp_path / "s.yaml").write_text(SCENARIO)
        serve, load = tmp_path / "serve-root", tmp_path / "load-root"
        target = Target(name="two", kind="ssh", engine="sim", run_root=str(tmp_path / "unused"), time_scale=100.0,
                        tuneloop=(sys.executable, "-m", "tuneloop_cli"), python=sys.executable,
                        ssh=SshOptions(port=1, known_hosts=sshd["known_hosts"], client_keys=(sshd["key"],)),
                        hosts=(Host(host="127.0.0.1", roles=("mixed",), cards=16, port=port, ssh_port=sshd["port"],
                                    run_root=str(serve)),
                               Host(host="localhost", roles=("load",), cards=0, ssh_port=second["port"],
                                    run_root=str(load))))
        ex = Executor(Store(f"sqlite:///{tmp_path / 'state.db'}"), {"two": target},
                      ExecSettings(runs_root=tmp_path / "runs", holder="two", poll_interval_s=0.1,
                                   timeouts_s={"health": 60.0, "load": 120.0}))
        r = ex.run_trial(TrialSpec(run_id="t1", goal_id="g", target="two", scenario=str(tmp_path / "s.yaml"), n=12,
                                   seed=1, knobs={"concurrency": 4, "request_rate": "inf"}))
        assert r.verdict.kind == "valid", (r.verdict, r.error)
        assert (serve / "svc" / "sim-0" / "pid").exists() and not (load / "svc").joinpath("sim-0").exists()
        assert (load / "runs" / "t1.load" / "done").exists() and not (serve / "runs" / "t1.load").exists()
        assert (serve / "epoch").read_text() == (load / "epoch").read_text()  # both hosts fenced at the same epoch
        assert "start-service sim-0" in (serve / "launch.log").read_text()
        assert "start-run t1.load" in (load / "launch.log").read_text()
        for d in (sshd["dir"], second["dir"]):
            assert "Accepted publickey" in (d / "sshd.log").read_text()
        from executor.templates import ServiceSpec
        from executor.transports.ssh import SshTransport

        t = SshTransport(target)
        svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("x",))
        assert asyncio.run(t.http(svc, "GET", "/health"))[0] == 200 and t.connects == 1  # asked over SSH
    finally:
        if target is not None:
            _stop(target, port)
        _stop_sshd(second)
