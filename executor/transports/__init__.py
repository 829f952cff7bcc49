"""Transports: sim (virtual time), local (processes here), ssh (asyncssh to a cluster)."""
from __future__ import annotations

from typing import Any

from executor.targets import Target


def make_transport(target: Target, **kw: Any) -> Any:
    """The transport for a target; imported lazily so `sim` never needs asyncssh."""
    if target.kind == "sim":
        from executor.transports.sim import SimTransport
        return SimTransport(target, **kw)
    if target.kind == "local":
        from executor.transports.local import LocalTransport
        return LocalTransport(target)
    from executor.transports.ssh import SshTransport
    return SshTransport(target)
