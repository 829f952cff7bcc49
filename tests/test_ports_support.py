"""tests/ports_support.py: the ports the tests' servers get are below the kernel's ephemeral range, free, distinct,
consecutive when a block is asked for, and never the same in two processes picking at once (two xdist workers)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from ports_support import LOWEST, ephemeral_floor, free_port, free_ports

TESTS = Path(__file__).resolve().parent
PICKS = 300  # per process: drawn at random from ~22 000 ports, two such sets without the shared lease would meet


def _bind(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    return s


def test_the_floor_is_the_kernels():
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    assert ephemeral_floor() == int(text.split()[0]) > LOWEST


def test_ports_are_below_the_ephemeral_floor_distinct_and_bindable():
    ports = free_ports(20) + [free_port() for _ in range(20)]
    assert len(set(ports)) == 40
    assert all(LOWEST <= p < ephemeral_floor() for p in ports)
    socks = [_bind(p) for p in ports]  # all at once: none is taken
    for s in socks:
        s.close()


def test_a_block_is_consecutive_free_and_apart_from_the_others():
    bases = free_ports(3, block=4)
    assert len(set(bases)) == 3
    assert all(LOWEST <= b and b + 4 <= ephemeral_floor() for b in bases)
    socks = [_bind(b + i) for b in bases for i in range(4)]  # twelve distinct ports, all bindable together
    assert len({s.getsockname()[1] for s in socks}) == 12
    for s in socks:
        s.close()


def test_two_processes_picking_at_once_never_get_the_same_port():
    code = (f"import json, sys; sys.path.insert(0, {str(TESTS)!r}); from ports_support import free_port; "
            f"print(json.dumps([free_port() for _ in range({PICKS})]))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    got = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        got.append(json.loads(out))
    a, b = (set(g) for g in got)
    assert len(a) == len(b) == PICKS
    assert not a & b
    assert not (a | b) & set(free_ports(20))  # nor with this process, later
