"""Transports: sim (virtual time), local (processes here), ssh (asyncssh to a cluster)."""
from __future__ import annotations

from typing import Any

from executor.targets import Target


def make_transport(target: Target, state_root: Any = None) -> Any:
    """The transport for a target (`state_root`: where a virtual target keeps its state). Imported lazily
    (deferring heavy optional dependencies): `sim` never needs asyncssh, a real target never the simulator."""
    if target.kind == "sim":
        from executor.transports.sim import SimTransport
        return SimTransport(target, root=state_root)
    if target.kind == "local":
        from executor.transports.local import LocalTransport
        return LocalTransport(target)
    from executor.transports.ssh import SshTransport
    return SshTransport(target)
