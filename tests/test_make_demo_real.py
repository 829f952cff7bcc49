"""`make demo-real` through make itself: with a llama-server that cannot start, no run is valid and the
target fails (the recipe's exit 3), and the servers it started are stopped either way."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ports_support import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_demo_real_with_a_broken_engine_exits_non_zero(tmp_path):
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'llama-server: broken on purpose' >&2\nexit 1\n")
    broken.chmod(0o755)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNELOOP_", "MAKE"))}
    out = tmp_path / "demo-real"
    p = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "demo-real", f"DEMO_REAL_DIR={out}",
                        f"DEMO_REAL_PORT={port}", f"LLAMA_SERVER={broken}"],
                       env=env, capture_output=True, text=True, timeout=900)
    text = p.stdout + p.stderr
    assert p.returncode != 0, text[-3000:]
    assert "no run was valid" in p.stderr and "broken on purpose" in p.stdout, text[-3000:]
    assert "Error 3" in p.stderr  # the loop's own verdict, not a setup step failing
    assert "stopped process groups" in p.stdout  # the clean-up ran after the failure
    assert (out / "tuneloop.db").exists()
