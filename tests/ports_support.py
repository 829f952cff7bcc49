"""Free local ports for the servers the tests start (no tests here): `free_port()`, `free_ports(k, block)`.

Binding port 0 and closing the socket picks a port from the kernel's ephemeral range
(net.ipv4.ip_local_port_range): between that pick and the server's own bind (seconds for a process that imports
the whole stack first, a minute for vLLM's NIXL side channel) any outgoing connection on this machine can take it
as its local port, and the server dies with "Address already in use" (tests/test_vllm_pd.py's prefill once did).
A port below the range's floor is never handed to an outgoing connection: only a process that asks for it by
number can take it. Each port picked here is below that floor, at or above LOWEST, bindable when picked, and
leased in a registry shared by every process of this user on this machine (both pytest-xdist workers, a second
pytest beside them) under a file lock: no two pickers get the same port while its lease lasts, and by the time it
ends the server has long bound the port (so the bind check refuses it).
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

LOWEST = 10000  # below this, the ports services on a test machine are configured to use
LEASE_S = 900.0  # a port handed out is not handed out again for this long
REGISTRY = Path(tempfile.gettempdir()) / f"tuneloop-test-ports-{os.getuid()}.json"
TRIES = 20000


def ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (net.ipv4.ip_local_port_range; Linux's default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_all(ports: range) -> list[socket.socket] | None:
    """Each of `ports` bound on every IPv4 address (the sockets, for the caller to close); None if one is taken."""
    socks: list[socket.socket] = []
    try:
        for p in ports:
            socks.append(socket.socket())
            socks[-1].bind(("0.0.0.0", p))  # taken on any local address (or by a listener on all of them): refused
    except OSError:
        for s in socks:
            s.close()
        return None
    return socks


def free_ports(k: int = 1, block: int = 1) -> list[int]:
    """k distinct ports, each the first of `block` consecutive ports that are all free (no two blocks overlap),
    below the kernel's ephemeral range; every port of every block is leased to the caller for LEASE_S."""
    top = ephemeral_floor() - block
    if top <= LOWEST:
        raise RuntimeError(f"no room below the ephemeral range's floor ({ephemeral_floor()}) above {LOWEST}")
    rng = random.SystemRandom()
    with open(REGISTRY.with_suffix(".lock"), "a") as lock, ExitStack() as held:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when `lock` closes
        now = time.time()
        try:
            leased = {int(p): t for p, t in json.loads(REGISTRY.read_text()).items() if t > now}
        except (OSError, ValueError, TypeError, AttributeError):  # none yet (or unreadable): start afresh
            leased = {}
        out: list[int] = []
        for _ in range(TRIES):
            if len(out) == k:
                break
            base = rng.randrange(LOWEST, top + 1)
            ports = range(base, base + block)
            if any(p in leased for p in ports) or (socks := _bind_all(ports)) is None:
                continue
            for s in socks:  # held until all k are picked: the blocks cannot overlap
                held.callback(s.close)
            out.append(base)
            leased.update((p, now + LEASE_S) for p in ports)
        if len(out) < k:
            raise RuntimeError(f"found {len(out)} of {k} free blocks of {block} in [{LOWEST}, {top + block})")
        tmp = REGISTRY.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(leased))
        tmp.replace(REGISTRY)
        return out


def free_port() -> int:
    """One free port below the kernel's ephemeral range, leased to the caller (see free_ports)."""
    return free_ports(1)[0]
