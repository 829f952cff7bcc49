"""README's quick start runs as written: the block under "## Quick start" (in the README's first 40 lines) in a
fresh folder holding this checkout's venv and examples, with bash -e, against a real `tuneloop serve` on a port of
the suite's own (PORT, the one variable the block reads): the goal tuned by the CLI, the same goal posted over REST,
its first card approved in chat, the report read back, the service stopped by the block's last line."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from ports_support import free_port

ROOT = Path(__file__).resolve().parents[1]


def quickstart() -> tuple[int, str]:
    """(the line the section starts on, the shell block under it)."""
    text = (ROOT / "README.md").read_text()
    head = text.index("\n## Quick start\n")
    block = re.search(r"```sh\n(.*?)```", text[head:], re.S)
    assert block is not None, "the quick start has no ```sh block"
    return text[:head].count("\n") + 2, block.group(1)


def test_the_quick_start_is_near_the_top_and_runs_as_written(tmp_path):
    line, block = quickstart()
    end = line + block.count("\n") + 3
    assert end <= 40, f"the quick start ends on line {end} of the README"
    top = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for need in ("make demo", "make test", "tuneloop serve", "TUNELOOP_TOKENS", "my-goal.yaml", "approve"):
        assert need in top, need  # the two commands, serve with a token, a goal of one's own, a chat approval
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {"PORT": str(free_port())}
    p = subprocess.Popen(["bash", "-e", "-c", block], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=300)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything the block left behind (it stops its service itself)
        except ProcessLookupError:
            pass
    said = "\n".join(x for x in out.splitlines() if not x.startswith("[progress]"))
    assert p.returncode == 0, said[-3000:]
    assert re.search(r"goal my-first-goal-\w+: (done|stopped)", said), said[-3000:]  # the CLI's run to a stop
    assert re.search(r"candidate \d+ \(.*\) approved by me", said), said[-3000:]  # the chat approval acted
    assert "# tuneloop report — goal my-first-goal-" in said and "maximise goodput" in said, said[-3000:]
    assert (tmp_path / "my.db").is_file() and list((tmp_path / "reports").glob("my-first-goal-*/report.html"))
