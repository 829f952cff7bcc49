"""`local` target: the launcher runs on this machine through plain subprocesses (argv, no shell)."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

from core.records import write_atomic
from executor.transports.base import CommandResult, LauncherTransport, Transient


class LocalTransport(LauncherTransport):
    async def run(self, argv: list[str], timeout: float = 60.0, host: str | None = None) -> CommandResult:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):  # it may end between the timeout and the kill (busy cores)
                proc.kill()
            await proc.wait()
            raise Transient(f"command timed out after {timeout:g}s: {argv[:4]}") from None
        return CommandResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    async def put_text(self, path: str, text: str, mode: int = 0o644, host: str | None = None) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, text, mode)

    async def spread_file(self, path: str, services: object) -> None:
        """One machine: every engine reads the file where it was written."""
        return None

    async def fetch_dir(self, remote: str, local: Path) -> None:
        if local.exists():
            shutil.rmtree(local)
        shutil.copytree(remote, local)
