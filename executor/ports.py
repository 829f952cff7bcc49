"""Free local ports for the servers tuneloop starts itself, and whether a port's listener is the one it started.

A free port is free only when asked: between picking it and the server binding it (seconds, for an engine that
imports its framework first) another process can take it, and a health probe on the port is then answered by
someone else's server. `owned` reads the kernel's socket table (/proc/net/tcp, tcp6) and the processes' open
descriptors, so a caller can tell its own server (started in a session of its own) from a stranger.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

PROC = Path("/proc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_inodes(port: int) -> set[str] | None:
    inodes: set[str] = set()
    seen = False
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    return inodes if seen else None


def owned(port: int, session: int) -> bool | None:
    """Whether a process of `session` (a server started with start_new_session: its pid) listens on `port`;
    False when only other processes do (or none does); None when the socket table cannot be read here."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    links = {f"socket:[{i}]" for i in inodes}
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getsid(int(d.name)) != session:
                continue
            if any(os.readlink(fd) in links for fd in (d / "fd").iterdir()):
                return True
        except (OSError, ValueError):
            continue
    return False
