"""executor.ports: a port's listener is told apart by its session, from the kernel's socket table."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from ports_support import free_port

from executor.ports import owned

LISTEN = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); time.sleep(60)")


def test_the_listener_of_a_port_is_its_own_sessions_and_no_one_elses():
    port = free_port()
    assert owned(port, os.getsid(0)) is False  # nobody listens yet
    proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert owned(port, proc.pid) is True
        assert owned(port, os.getsid(0)) is False  # this test's session did not start it
        assert owned(free_port(), proc.pid) is False
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while owned(port, proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert owned(port, proc.pid) is False
