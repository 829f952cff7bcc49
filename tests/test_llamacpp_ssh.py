"""One llama.cpp experiment through the ssh target (a real OpenSSH sshd this test starts): the server is
launched detached on the target, loaded by the target-side load generator, and its run fetched by SFTP."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ports_support import free_port
from test_llamacpp_loop import BASE, _trial, engine  # noqa: F401  (engine: shared fixture)
from test_ssh_exec import sshd  # noqa: F401  (the test sshd fixture)

from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, SshOptions, Target
from state.store import Store


def test_one_llamacpp_experiment_over_ssh(engine, sshd, tmp_path):  # noqa: F811
    target = Target(name="llama-ssh", kind="ssh", engine="llamacpp", engine_command=(engine["bin"],),
                    model=engine["model"], run_root=str(tmp_path / "remote"),
                    tuneloop=(sys.executable, "-m", "tuneloop_cli"),
                    ssh=SshOptions(port=sshd["port"], known_hosts=sshd["known_hosts"], client_keys=(sshd["key"],)),
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=free_port()),))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ex = Executor(store, {"llama-ssh": target}, ExecSettings(runs_root=tmp_path / "runs", holder="t", poll_interval_s=0.1))
    try:
        res = ex.run_trial(_trial("ssh-1", "llama-ssh", BASE | {"parallel": 2}, n=24))
        assert res.verdict.kind == "valid", res.verdict
        s = res.summary
        assert s.n_ok == 24 and s.n_failed == 0 and s.output_len_min == s.output_len_max == 32
        assert res.source_identity.startswith("llamacpp:") and "sha256=unknown" not in res.source_identity
        assert res.evidence.decode_batch_limit == 2 and res.evidence.samples  # llamacpp:* scraped
    finally:
        for pid_file in Path(target.run_root).glob("svc/*/pid"):
            try:
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        store.close()
