"""Source identity of a real engine, asked on its host: the image digest from the target YAML, else
the engine's own version (with its build commit), else the sha256 of its binary."""
from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time

import pytest

from executor.identity import parse_version, source_identity
from executor.targets import Host, Target
from executor.templates import ServiceSpec
from executor.transports.local import LocalTransport


def _engine(tmp_path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


def _ident(tmp_path, engine: str, binary: str, image: str | None = None, wrapper: tuple[str, ...] = ()) -> str:
    t = Target(name="loc", kind="local", engine=engine, model="m", run_root=str(tmp_path / "tgt"),
               hosts=(Host(host="127.0.0.1", roles=("mixed", "load")),))
    svc = ServiceSpec(name="mixed-0", role="mixed", host="127.0.0.1", port=1,
                      argv=(*wrapper, binary, "--port", "1"))
    return asyncio.run(source_identity(LocalTransport(t), engine, svc, sys.executable, image))


def test_llama_server_states_its_build_and_commit(tmp_path):
    exe = _engine(tmp_path, "llama-server", 'echo "version: 6123 (1a2b3c4d)" >&2; echo "built with cc" >&2')
    assert _ident(tmp_path, "llamacpp", exe) == "llamacpp:version=6123 (1a2b3c4d)"


def test_llama_server_current_version_line(tmp_path):  # llama.cpp common/build-info.cpp.in since 2026
    exe = _engine(tmp_path, "llama-server", 'echo "version: 0.6.0-dev (build 11434, commit b11434)" >&2')
    assert _ident(tmp_path, "llamacpp", exe) == "llamacpp:version=11434 (b11434)"


def test_vllm_version_after_its_log_lines(tmp_path):
    exe = _engine(tmp_path, "vllm", 'echo "INFO 11-30 12:00:00 [__init__.py] Automatically detected platform cuda."; '
                                     'echo 0.11.1.dev12+g1234abcd')
    assert _ident(tmp_path, "vllm", exe) == "vllm:version=0.11.1.dev12+g1234abcd"


def test_no_version_falls_back_to_the_binary_hash(tmp_path):
    exe = _engine(tmp_path, "vllm", "echo 'usage: vllm' >&2; exit 2")
    digest = hashlib.sha256(open(exe, "rb").read()).hexdigest()[:16]
    assert _ident(tmp_path, "vllm", exe) == f"vllm:{exe}:sha256={digest}"
    # behind a CPU-placement wrapper the hash is still the engine's binary, not taskset's
    assert _ident(tmp_path, "vllm", exe, wrapper=("taskset", "-c", "0")) == f"vllm:{exe}:sha256={digest}"


@pytest.mark.parametrize("wrapper", [("taskset", "-c", "0"), ("/usr/bin/taskset", "0x1"),
                                     ("numactl", "--physcpubind=0", "-l"), ("numactl", "-C", "0", "-m", "0"),
                                     ("taskset", "-c", "0", "numactl", "--localalloc"), ("nice", "-n", "10"),
                                     ("/usr/bin/nice", "-5"), ("nice", "--adjustment", "3", "taskset", "-c", "0")])
def test_a_cpu_placement_wrapper_is_looked_through(tmp_path, wrapper):
    """`engine_command: [taskset, -c, 1, vllm]` pins the engine (bench/engine_crosscheck.py does), `[nice, -n, 10,
    vllm]` lowers its priority (the real-vLLM tests do); the version is still asked of vllm, never of the wrapper
    (`taskset --version` or `nice --version` would name util-linux or coreutils)."""
    exe = _engine(tmp_path, "vllm", "echo 0.32.0")
    assert _ident(tmp_path, "vllm", exe, wrapper=wrapper) == "vllm:version=0.32.0"


def test_image_digest_in_the_target_wins(tmp_path):
    exe = _engine(tmp_path, "vllm", "echo 0.11.0")
    assert _ident(tmp_path, "vllm", exe, "sha256:abc123") == "vllm:image=sha256:abc123"
    with pytest.raises(ValueError, match="image_digest"):
        Target(name="x", kind="local", engine="vllm", model="m", image_digest="sha256:a;rm -rf /",
               hosts=(Host(host="h", roles=("mixed", "load")),))


def test_parse_version_refuses_noise():
    assert parse_version("vllm", "Traceback (most recent call last):\nImportError: x") is None
    assert parse_version("llamacpp", "no version here") is None


def test_an_unchanged_binary_states_its_version_once_per_process(tmp_path):
    """`vllm --version` imports torch (over two minutes on a loaded host): a binary whose file is unchanged is not
    asked again; a rewritten one (a reinstall) is."""
    asked = tmp_path / "asked"
    exe = _engine(tmp_path, "vllm", f"echo x >> {asked}; echo 0.32.0+cpu")
    assert _ident(tmp_path, "vllm", exe) == _ident(tmp_path, "vllm", exe) == "vllm:version=0.32.0+cpu"
    assert asked.read_text().count("x") == 1
    exe = _engine(tmp_path, "vllm", f"echo x >> {asked}; echo 0.33.0+cpu")  # rewritten in place
    os.utime(exe, (time.time() + 5, time.time() + 5))  # a later mtime even within the filesystem's resolution
    assert _ident(tmp_path, "vllm", exe) == "vllm:version=0.33.0+cpu" and asked.read_text().count("x") == 2
