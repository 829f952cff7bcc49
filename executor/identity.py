"""Source identity of a real engine: what a station's results were measured on.

Preference: an image digest declared in the target YAML (containers are identified by it), then the
engine's own word (`vllm --version`, `llama-server --version`, the sglang / mindie package version),
then the sha256 of the engine binary. Asked on the host that runs the engine.
"""
from __future__ import annotations

from typing import Any

from core.station import Station
from executor.engines import ADAPTERS
from executor.engines.base import ServiceSpec


def version_probe(engine: str, argv: tuple[str, ...], python: str) -> list[str] | None:
    """The command that makes this engine state its version, or None when it has none (its adapter knows)."""
    a = ADAPTERS.get(engine)
    return a.version_probe(argv, python) if a else None


def parse_version(engine: str, out: str) -> str | None:
    """The version (with build/commit where the engine prints one) from the probe's output."""
    a = ADAPTERS.get(engine)
    return a.parse_version(out) if a else None


async def source_identity(transport: Any, engine: str, svc: ServiceSpec, python: str,
                          image_digest: str | None = None) -> str:
    if image_digest:
        return f"{engine}:image={image_digest}"
    probe = version_probe(engine, svc.argv, python)
    if probe:
        res = await transport.run(probe, timeout=120.0, host=svc.host)
        ver = parse_version(engine, f"{res.stdout}\n{res.stderr}") if res.rc == 0 else None
        if ver:
            return f"{engine}:version={ver}"
    res = await transport.run(["sh", "-c", 'p=$(command -v "$1") && sha256sum "$p"', "sh", svc.argv[0]], host=svc.host)
    digest = res.stdout.split()[0][:16] if res.rc == 0 and res.stdout else "unknown"
    return f"{engine}:{svc.argv[0]}:sha256={digest}"


def probe_service(target: Any) -> ServiceSpec:
    """The engine service whose identity we record: the first one (prefill, or the only one)."""
    dummy = Station(engine=target.engine, knobs={}, scenario="-", data_version="-", source_identity="-", target=target.name)
    return ADAPTERS[target.template or target.engine].render(target, dummy).services[0]
