"""Source identity of a real engine: what a station's results were measured on.

Preference: an image digest declared in the target YAML (containers are identified by it), then the
engine's own word (`vllm --version`, `llama-server --version`, the sglang / mindie package version),
then the sha256 of the engine binary. Asked on the host that runs the engine. A CPU-placement or priority wrapper
at the head of a target's `engine_command` (`taskset -c 1 vllm`, `numactl --cpunodebind=0 --membind=0 vllm`,
`nice -n 10 vllm`) is looked through: the version and the binary are the engine's, not the wrapper's.
"""
from __future__ import annotations

from typing import Any

from core.station import Station
from executor.engines import ADAPTERS
from executor.engines.base import ServiceSpec


# numactl's options that take their value as the next word (the rest are flags or --opt=value)
_NUMACTL_VALUED = {"-C", "-N", "-m", "-p", "-i", "--physcpubind", "--cpunodebind", "--membind", "--preferred",
                   "--interleave"}
_NICE_VALUED = {"-n", "--adjustment"}  # nice's option with its value as the next word (`-10`, `-n10` are one)
# a wrapper looked through: its options that take the next word as their value, and the words it takes after its
# options before the command (taskset's core list or mask)
_WRAPPERS = {"taskset": (frozenset(), 1), "numactl": (_NUMACTL_VALUED, 0), "nice": (_NICE_VALUED, 0)}


def engine_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """argv without a leading `taskset` / `numactl` / `nice` (their options and, for taskset, its core list or
    mask)."""
    argv = tuple(argv)
    while argv and (wrapper := _WRAPPERS.get(argv[0].rsplit("/", 1)[-1])) is not None:
        valued, positional = wrapper
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            i += 2 if argv[i] in valued else 1
        argv = argv[i + positional:]
    return argv


def version_probe(engine: str, argv: tuple[str, ...], python: str) -> list[str] | None:
    """The command that makes this engine state its version, or None when it has none (its adapter knows)."""
    a = ADAPTERS.get(engine)
    argv = engine_argv(argv)
    return a.version_probe(argv, python) if a and argv else None


def parse_version(engine: str, out: str) -> str | None:
    """The version (with build/commit where the engine prints one) from the probe's output."""
    a = ADAPTERS.get(engine)
    return a.parse_version(out) if a else None


# (host, probe, the binary file's path, size, mtime and inode) -> the version its probe printed, for this process:
# `vllm --version` imports torch, over two minutes on a loaded host (it timed out a demo's second run), and the
# binary's own file says whether anything changed since it answered (a reinstall rewrites it)
_VERSIONS: dict[tuple[str, tuple[str, ...], str], str] = {}


async def _binary_stat(transport: Any, binary: str, host: str) -> str | None:
    res = await transport.run(["sh", "-c", 'p=$(command -v "$1") && stat -L -c "%n %s %Y %i" "$p"', "sh", binary],
                              host=host)
    return (res.stdout.strip() or None) if res.rc == 0 else None


async def source_identity(transport: Any, engine: str, svc: ServiceSpec, python: str,
                          image_digest: str | None = None) -> str:
    if image_digest:
        return f"{engine}:image={image_digest}"
    probe = version_probe(engine, svc.argv, python)
    binary = (engine_argv(svc.argv) or svc.argv)[0]
    if probe:
        # a probe that runs the engine's binary itself is asked once per unchanged binary file (a probe through
        # python reads a package's metadata, which the interpreter's file does not track)
        stat = await _binary_stat(transport, binary, svc.host) if probe[0] == binary else None
        key = (svc.host, tuple(probe), stat or "")
        if stat and key in _VERSIONS:
            return f"{engine}:version={_VERSIONS[key]}"
        res = await transport.run(probe, timeout=120.0, host=svc.host)
        ver = parse_version(engine, f"{res.stdout}\n{res.stderr}") if res.rc == 0 else None
        if ver:
            if stat:
                _VERSIONS[key] = ver
            return f"{engine}:version={ver}"
    res = await transport.run(["sh", "-c", 'p=$(command -v "$1") && sha256sum "$p"', "sh", binary], host=svc.host)
    digest = res.stdout.split()[0][:16] if res.rc == 0 and res.stdout else "unknown"
    return f"{engine}:{binary}:sha256={digest}"


def probe_service(target: Any) -> ServiceSpec:
    """The engine service whose identity we record: the first one (prefill, or the only one)."""
    dummy = Station(engine=target.engine, knobs={}, scenario="-", data_version="-", source_identity="-", target=target.name)
    return ADAPTERS[target.template or target.engine].render(target, dummy).services[0]
