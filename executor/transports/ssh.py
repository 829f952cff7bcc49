"""`ssh` target: asyncssh with host-key verification and keepalive on, reconnect on loss, SFTP.

Every remote command is `shlex.join` of validated argv (base.remote_command). A lost connection is
Transient: the connection is dropped, re-opened and the command re-sent, a bounded number of times.
That is safe for every launcher action: a repeated launch meets its own mkdir claim (AlreadyClaimed)
and the runner then reads the markers. A host key that does not match known_hosts is never retried.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import asyncssh
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from executor.targets import Target
from executor.templates import ServiceSpec
from executor.transports.base import (
    CommandResult,
    LauncherTransport,
    Transient,
    TransportError,
    remote_command,
)

_HTTP_PROBE = """import sys, urllib.request as u, urllib.error as e
try:
    r = u.urlopen(u.Request(sys.argv[2], method=sys.argv[1], data=b"" if sys.argv[1] == "POST" else None),
                  timeout=float(sys.argv[3])); code, body = r.status, r.read()
except e.HTTPError as x:
    code, body = x.code, x.read()
except Exception as x:
    code, body = "-", repr(x).encode()
sys.stdout.write(str(code) + "\\n" + body.decode("utf-8", "replace")[:65536])
"""


class HostKeyRefused(TransportError):
    pass


class SshTransport(LauncherTransport):
    def __init__(self, target: Target):
        super().__init__(target)
        assert target.ssh is not None
        self.opts = target.ssh
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self.connects = 0  # how many connections were opened (reconnects show up here)

    def _host(self, host: str | None) -> str:
        return host or self.target.hosts_for("load")[0].host

    def _port(self, host: str) -> int:
        h = self.target.host_entry(host)
        return (h.ssh_port if h and h.ssh_port else None) or self.opts.port

    async def _conn(self, host: str) -> asyncssh.SSHClientConnection:
        c = self._conns.get(host)
        if c is not None and not c.is_closed():
            return c
        port = self._port(host)
        try:
            extra = {"username": self.opts.user} if self.opts.user else {}
            c = await asyncssh.connect(
                host, port=port, known_hosts=os.path.expanduser(self.opts.known_hosts), **extra,
                client_keys=[os.path.expanduser(k) for k in self.opts.client_keys] or None,
                keepalive_interval=self.opts.keepalive_interval, keepalive_count_max=self.opts.keepalive_count_max,
                connect_timeout=self.opts.connect_timeout, agent_path=None)
        except asyncssh.HostKeyNotVerifiable as e:
            raise HostKeyRefused(
                f"ssh {host}:{port}: the host key does not match {self.opts.known_hosts} ({e}); "
                "refusing to connect. If the host was re-installed, verify its new key and update known_hosts.") from None
        except asyncssh.PermissionDenied as e:
            raise TransportError(f"ssh {host}:{port}: authentication refused: {e}") from None
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
            raise Transient(f"ssh {host}:{port}: cannot connect: {e!r}") from None
        self._conns[host] = c
        self.connects += 1
        return c

    def _drop(self, host: str) -> None:
        c = self._conns.pop(host, None)
        if c is not None:
            c.abort()

    async def _with_reconnect(self, host: str, op):  # type: ignore[no-untyped-def]
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.opts.reconnect_attempts),
                                           wait=wait_exponential(multiplier=0.2, max=5.0),
                                           retry=retry_if_exception_type(Transient), reraise=True):
            with attempt:
                conn = await self._conn(host)
                try:
                    return await op(conn)
                except (asyncssh.ConnectionLost, asyncssh.DisconnectError, BrokenPipeError, ConnectionError) as e:
                    self._drop(host)
                    raise Transient(f"ssh {host}: connection lost: {e!r}") from None
                except asyncssh.ChannelOpenError as e:
                    self._drop(host)
                    raise Transient(f"ssh {host}: channel refused: {e!r}") from None

    async def run(self, argv: list[str], timeout: float = 60.0, host: str | None = None) -> CommandResult:
        h = self._host(host)

        async def op(conn: asyncssh.SSHClientConnection) -> CommandResult:
            try:
                res = await conn.run(remote_command(argv), check=False, timeout=timeout)
            except asyncssh.TimeoutError as e:
                raise Transient(f"ssh {h}: command timed out after {timeout:g}s") from e
            if res.exit_status is None and res.exit_signal is None:
                self._drop(h)  # no exit status after a lost channel is not success
                raise Transient(f"ssh {h}: no exit status (channel lost)")
            out = res.stdout if isinstance(res.stdout, str) else (res.stdout or b"").decode(errors="replace")
            err = res.stderr if isinstance(res.stderr, str) else (res.stderr or b"").decode(errors="replace")
            return CommandResult(res.exit_status, out, err)
        return await self._with_reconnect(h, op)

    async def http(self, svc: ServiceSpec, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, str]:
        """Probed on the service's own host (its port need not be reachable from here): a stdlib one-liner."""
        url = f"http://{svc.host}:{svc.port}{path}"
        try:
            res = await self.run([self.target.python, "-c", _HTTP_PROBE, method, url, repr(timeout)],
                                 timeout=timeout + 30.0, host=svc.host)
        except Transient as e:  # the host could not be asked: no answer, like a refused connection
            return None, str(e)
        head, _, body = res.stdout.partition("\n")
        return (int(head) if head.strip().isdigit() else None), body

    async def put_text(self, path: str, text: str, mode: int = 0o644, host: str | None = None) -> None:
        h = self._host(host)
        tmp = f"{path}.tmp{os.getpid()}"

        async def op(conn: asyncssh.SSHClientConnection) -> None:
            async with conn.start_sftp_client() as sftp:
                async with sftp.open(tmp, "w") as f:
                    await f.write(text)
                await sftp.chmod(tmp, mode)
                await sftp.posix_rename(tmp, path)
        await self._with_reconnect(h, op)

    async def fetch_dir(self, remote: str, local: Path) -> None:

        if local.exists():
            shutil.rmtree(local)
        local.parent.mkdir(parents=True, exist_ok=True)

        async def op(conn: asyncssh.SSHClientConnection) -> None:
            async with conn.start_sftp_client() as sftp:
                await sftp.get(remote, str(local), recurse=True, preserve=False)
        await self._with_reconnect(self._host(None), op)

    async def close(self) -> None:
        for h in list(self._conns):
            c = self._conns.pop(h)
            c.close()
            await c.wait_closed()
