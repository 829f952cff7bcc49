"""llama.cpp `llama-server`: one mixed instance, `--metrics`, slot erase as the prefix-cache flush.

Slot erase empties the slots' KV only: llama-server also keeps a host-RAM prompt cache (`--cache-ram N`, on by
default, 8192 MiB; idle slots are saved into it and a matching prompt is loaded back, tools/server/server-context.cpp),
which erase leaves holding earlier prompts. A flush therefore counts only where that cache is off (`--cache-ram 0`,
`-cram 0` or LLAMA_ARG_CACHE_RAM=0); elsewhere it reports not flushed and the runner restarts the server.
"""
from __future__ import annotations

import json
import re
from typing import Any

from core.errors import FieldError
from core.station import Station
from executor.engines.base import Adapter, Rendered, ServiceSpec, generic_argv, knob_flags
from executor.targets import Host, Target


class LlamaCpp(Adapter):
    name = "llamacpp"
    knob_key = "llamacpp"
    pinned = "llama.cpp b11434 (executor/engines/llamacpp_build.py builds it from source)"
    metrics = {
        "running": ("llamacpp:requests_processing",),
        "waiting": ("llamacpp:requests_deferred",),
        "busy_slots": ("llamacpp:n_busy_slots_per_decode",),
        # no KV-usage gauge: llama.cpp #13660 removed llamacpp:kv_cache_usage_ratio
        "spec_drafts": ("llamacpp:spec_decode_num_drafts_total",),
        "spec_accepted": ("llamacpp:spec_decode_num_accepted_tokens_total",),
    }

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        host = serving_host(target)
        argv = [*(target.engine_command or ("llama-server",)), "--host", "0.0.0.0", "--port", str(host.port), "--metrics"]
        if target.model:
            argv += ["-m", target.model]
        argv += ["--slot-save-path", "."]  # without it llama-server answers 501 to slot erase (the prefix-cache flush)
        argv += generic_argv(knob_flags(station.server_knobs, self.knob_key, "mixed")) + list(target.extra_args.get("mixed", ()))
        svc = ServiceSpec(name="mixed-0", role="mixed", host=host.host, port=host.port, argv=tuple(argv),
                          env=dict(target.env), cards=host.cards)
        url = f"http://{host.host}:{host.port}"
        return Rendered(services=(svc,), endpoint=url, metrics={"mixed": f"{url}/metrics"}, engine="llamacpp")

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [argv[0], "--version"]

    def parse_version(self, out: str) -> str | None:
        # "version: 0.6.0-dev (build 11434, commit b11434)"; before 2026 "version: 6123 (1a2b3c4d)"
        text = out.strip()
        m = re.search(r"version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+([0-9A-Za-z._-]+)\)", text) or \
            re.search(r"version:\s*(\d+)\s*\(([0-9a-f]+)\)", text)
        return f"{m.group(1)} ({m.group(2)})" if m else None

    async def flush(self, probe: Any, svc: ServiceSpec) -> dict[str, Any]:
        """Erase every slot's KV (GET /slots, then POST /slots/{id}?action=erase for each)."""
        status, body = await probe.http(svc, "GET", "/slots")
        try:
            ids = [int(s["id"]) for s in json.loads(body)] if status == 200 else None
        except (ValueError, TypeError, KeyError):
            ids = None
        if ids is None:
            return {"service": svc.name, "method": "GET /slots", "status": status, "ok": False}
        codes = [(await probe.http(svc, "POST", f"/slots/{i}?action=erase"))[0] for i in ids]
        out = {"service": svc.name, "method": "POST /slots/{id}?action=erase", "slots": len(ids),
               "status": codes, "ok": all(c == 200 for c in codes)}
        if not ram_cache_off(svc):
            out |= {"ok": False, "held": "host-RAM prompt cache (--cache-ram): slot erase leaves it holding prompts"}
        return out


def ram_cache_off(svc: ServiceSpec) -> bool:
    """Whether the server runs without its host-RAM prompt cache (the last --cache-ram / -cram wins, as argparse)."""
    value = svc.env.get("LLAMA_ARG_CACHE_RAM")
    argv = list(svc.argv)
    for i, a in enumerate(argv):
        if a in ("--cache-ram", "-cram") and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--cache-ram="):
            value = a.split("=", 1)[1]
    return value is not None and value.strip() == "0"


def serving_host(target: Target) -> Host:
    """The host llama-server starts on: the one with the role 'mixed' (llama.cpp has no PD), else the only host. A
    target whose first host is its load host (the order a target lists them in says nothing) would otherwise start
    the server where the load generator runs and send the load to a port nothing listens on."""
    serving = target.hosts_for("mixed")
    if len(serving) > 1:
        raise FieldError("hosts", f"llama.cpp runs one instance, but {len(serving)} hosts have the role 'mixed' "
                         f"({', '.join(f'{h.host}:{h.port}' for h in serving)})")
    if serving:
        return serving[0]
    if len(target.hosts) == 1:
        return target.hosts[0]
    raise FieldError("hosts", "llama.cpp needs the host it serves on to have the role 'mixed' "
                     f"(none of {', '.join(h.host for h in target.hosts)} has it)")


ADAPTER = LlamaCpp()
