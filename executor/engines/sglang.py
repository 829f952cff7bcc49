"""SGLang (`python -m sglang.launch_server`): PD by `--disaggregation-mode`, sglang_router in front."""
from __future__ import annotations

from typing import Any

from core.station import Station
from executor.engines.base import (PY_VERSION, Adapter, Host, Rendered, ServiceSpec, device_env, fmt, instances,
                                   knob_flags, svc_dir, with_router)
from executor.targets import Target


def sglang_knob_args(knobs: dict[str, Any], role: str) -> list[str]:
    argv: list[str] = []
    spec_method, k = None, 0
    for flag, value in knob_flags(knobs, "sglang", role):
        if flag == "--disable-radix-cache":
            if value is False:  # the catalog's knob is "enable"; SGLang's flag says "disable"
                argv.append(flag)
        elif flag == "--enable-eplb":
            if value == "static_eplb":
                argv.append(flag)
        elif flag == "--speculative-algorithm":
            spec_method = value
        elif flag == "--speculative-num-draft-tokens":
            k = int(value)
        elif isinstance(value, bool):
            if value:
                argv.append(flag)
        else:
            argv += [flag, fmt(value)]
    if spec_method not in (None, "none") and k > 0:
        # DeepSeek MTP runs as EAGLE with the model's NextN heads: k steps, top-1, k + 1 draft tokens
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(k),
                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
    return argv


def router_argv(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
    argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "0.0.0.0",
            "--port", str(router.port)]
    for s in ps:
        argv += ["--prefill", f"http://{s.host}:{s.port}"]
    for s in ds:
        argv += ["--decode", f"http://{s.host}:{s.port}"]
    return argv + list(target.extra_args.get("router", ()))


class SGLang(Adapter):
    name = "sglang"
    knob_key = "sglang"
    pinned = "sglang 0.5.23, sglang-router 0.3.2"
    flush_path = "/flush_cache"
    profile_routes = ("/start_profile", "/stop_profile")
    metrics = {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "accept_length": ("sglang:spec_accept_length",),
    }

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        services: list[ServiceSpec] = []
        for role, i, host in instances(target):
            argv = ["python", "-m", "sglang.launch_server", "--model-path", str(target.model),
                    "--host", "0.0.0.0", "--port", str(host.port), "--enable-metrics"]
            if target.pd:
                argv += ["--disaggregation-mode", role,
                         "--disaggregation-transfer-backend", target.pd_connector or "mooncake"]
            argv += sglang_knob_args(station.server_knobs, role) + list(target.extra_args.get(role, ()))
            trace = f"{svc_dir(target, f'{role}-{i}', host.host)}/trace"
            env = device_env(target, host, "CUDA_VISIBLE_DEVICES") | {"SGLANG_TORCH_PROFILER_DIR": trace}
            services.append(ServiceSpec(name=f"{role}-{i}", role=role, host=host.host, port=host.port,
                                        argv=tuple(argv), env=env, cards=host.cards, profile_dir=trace))
        return with_router(target, services, "sglang", router_argv)

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [argv[0] if "python" in argv[0] else python, "-c", PY_VERSION, "sglang"]


ADAPTER = SGLang()
