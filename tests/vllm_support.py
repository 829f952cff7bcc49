"""Shared by the real-vLLM tests: the installed vllm (a missing one fails under CI=true, never skips), the
generated model, and its own parser fed through the vLLM venv's python (tests/vllm_argcheck.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from unavailable import missing

from core.station import Station, full_knobs
from executor.targets import Host, Target

HERE = Path(__file__).resolve().parent
SCENARIO = "vllm-chat"
# the engines run at a lower priority than the suite: vLLM's CPU workers spin on their shared-memory queues between
# steps (vllm/distributed/device_communicators/shm_broadcast.py, sched_yield; the CPU platform forces the
# multiprocess executor), so at an equal priority three instances took most of both cores from the tests running
# beside them (a 16 s test took 227 s). Niced, the spin yields to that work and still gets what is idle; the load
# generator and the executor stay at the suite's priority. The identity looks through `nice` (executor/identity.py).
NICENESS = 10
NICE = ("nice", "-n", str(NICENESS))
# flags every CPU launch here needs (the targets file's extra_args carry the same)
CPU_EXTRA = ("--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
             "--served-model-name", "tiny")


def engine_or_fail(tmp_root: Path) -> dict:
    from executor.engines.vllm_cli import model_for
    from executor.engines.vllm_setup import vllm_binary

    try:
        binary = vllm_binary()
    except FileNotFoundError as e:
        missing(f"vllm is not installed: {e} (make vllm)")
    model, digest = model_for(SCENARIO, tmp_root / "vllm-models", binary)
    return {"bin": binary, "python": str(Path(binary).parent / "python"), "model": str(model), "sha256": digest}


def target(engine: dict, root: Path, port: int, name: str = "vllm", **over) -> Target:
    from executor.engines.vllm_setup import BASE_ENV

    fields = dict(name=name, kind="local", engine="vllm", engine_command=(*NICE, engine["bin"]), model=engine["model"],
                  run_root=str(root), tuneloop=(sys.executable, "-m", "tuneloop_cli"), env=dict(BASE_ENV),
                  extra_args={"mixed": CPU_EXTRA},
                  hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=port),))
    return Target(**(fields | over))


def station(knobs: dict, name: str = "vllm") -> Station:
    return Station(engine="vllm", knobs=full_knobs(knobs, "vllm"), scenario=SCENARIO, data_version="d",
                   source_identity="s", target=name)


def parse_with_vllm(python: str, argvs: list[list[str]]) -> list[dict]:
    """Each argv (starting at `serve`) through the installed vLLM's own `vllm serve` parser."""
    out = subprocess.run([python, str(HERE / "vllm_argcheck.py")], input=json.dumps(argvs), capture_output=True,
                         text=True, timeout=600, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
