"""Running an engine command's text in a real shell, each engine program a stub that records what it was handed
(tests/test_best_station.py, tests/test_engine_command.py): the text is copy-pasteable exactly when bash hands the
program the rendered argv and environment, and writes the rendered files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAMS = ("vllm", "vllm-router", "python", "python3", "llama-server", "mindieservice_daemon")
STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_OUT"], "a") as f:
    f.write(json.dumps({{"argv": [os.path.basename(sys.argv[0])] + sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
"""


def through_a_shell(shell: str, tmp_path: Path, programs: tuple[str, ...] = PROGRAMS) -> tuple[list[str], dict]:
    """Run the command's lines in bash with each engine program a stub that records what it was handed: (argv,
    the variables the line set)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in programs:
        p = stubs / name
        p.write_text(STUB.format(python=sys.executable))
        p.chmod(0o755)
    out = tmp_path / "calls.jsonl"
    out.unlink(missing_ok=True)
    base = {"PATH": f"{stubs}{os.pathsep}/usr/bin:/bin", "STUB_OUT": str(out), "LANG": "C.UTF-8"}
    proc = subprocess.run(["bash", "-euc", shell], env=base, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (call,) = [json.loads(x) for x in out.read_text().splitlines()]
    shells = ("PWD", "SHLVL", "_", "OLDPWD", "LC_CTYPE")  # what bash (and Python's locale coercion) add
    env = {k: v for k, v in call["env"].items() if k not in base and k not in shells}
    return call["argv"], env
