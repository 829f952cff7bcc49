"""SGLang (`python -m sglang.launch_server`, written against SGLang 0.5.23 and sglang-router 0.3.2).

PD by `--disaggregation-mode prefill|decode`; each prefill instance gets its own `--disaggregation-bootstrap-port`
(default 8998: two prefill instances on one host would collide) and the router is told it
(`--prefill URL BOOTSTRAP_PORT`, else decode falls back to 8998). `--max-prefill-tokens` (default 16384) also caps a
prefill batch, so it moves with `--chunked-prefill-size`. `--mem-fraction-static` is computed by SGLang when
absent, so the catalog default is not rendered. With attention DP an instance takes a fixed block of ports above
`--port` (executor/engines/sglang_ports.py: one that would overlap another gets `--dist-init-addr` with a free block),
and `--dp-size` with `--attn-dp-size` both above 1 is refused (SGLang refuses it). A static expert layout is
`--init-expert-location`; a dynamic one `--enable-eplb` (periodic rebalancing) with the recorder in `stat` mode,
which it reads. `/flush_cache` answers 400 when it cannot flush (sglang/srt/server_args.py, srt/arg_groups/fields/*.py, srt/managers/scheduler.py).
"""
from __future__ import annotations

from core.errors import FieldError
from core.station import Station
from executor.engines.base import (PY_VERSION, Adapter, Host, Rendered, ServiceSpec, device_env, fmt, instances,
                                   knob_flags, parallel_sizes, static_layout_path, svc_dir, with_router)
from executor.engines.sglang_groups import BOOTSTRAP_PORT, render_groups
from executor.engines.sglang_ports import dist_init_ports
from executor.targets import Target

MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens


def ep_size(station: Station, tp: int) -> int:
    """The instance's --ep-size: experts over its TP group with expert parallelism on, else SGLang's default 1."""
    return tp if station.server_knobs.get("enable_expert_parallel") else 1


def router_argv(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec],
                bootstrap: dict[str, int]) -> list[str]:
    argv = [*(target.router_command or ("python", "-m", "sglang_router.launch_router")), "--pd-disaggregation",
            "--host", "0.0.0.0", "--port", str(router.port),
            "--worker-startup-timeout-secs", str(target.worker_start_s)]  # 600 s there (router_args.py)
    for s in ps:
        argv += ["--prefill", f"http://{s.host}:{s.port}", str(bootstrap[s.name])]
    for s in ds:
        argv += ["--decode", f"http://{s.host}:{s.port}"]
    return argv + list(target.extra_args.get("router", ()))


class SGLang(Adapter):
    name = "sglang"
    knob_key = "sglang"
    pinned = "sglang 0.5.23, sglang-router 0.3.2"
    flush_path = "/flush_cache"
    profile_routes = ("/start_profile", "/stop_profile")
    defaults = {"enable_prefix_caching": True, "expert_layout": "none", "speculative_method": "none",
                "data_parallel_size": 1, "attn_dp_size": 1, "enable_expert_parallel": False}
    automatic = frozenset({"gpu_memory_utilization"})
    metrics = {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "accept_length": ("sglang:spec_accept_length",),
        # PD queues (srt/observability/metrics_collector.py): prefill waits for the decode handshake
        # (bootstrap), then sends (inflight); decode waits for KV room (prealloc), then receives (transfer)
        "prefill_bootstrap": ("sglang:num_prefill_bootstrap_queue_reqs",),
        "prefill_inflight": ("sglang:num_prefill_inflight_queue_reqs",),
        "decode_prealloc": ("sglang:num_decode_prealloc_queue_reqs",),
        "waiting_deferred": ("sglang:num_decode_transfer_queue_reqs",),
        # failed KV hand-offs, counted by both roles (srt/observability/metrics_collector.py, 0.5.23: the transfer
        # backend's KV transfer failed; the bootstrap handshake between P and D failed)
        "kv_failed_transfers": ("sglang:num_transfer_failed_reqs_total",),
        "kv_failed_bootstraps": ("sglang:num_bootstrap_failed_reqs_total",),
        # what prefill sent, per request (histograms; observability/req_time_stats.py: the transfer's latency in ms,
        # its size in bytes / 2**20)
        "kv_sent": ("sglang:kv_transfer_latency_ms_count",),
        "kv_sent_ms": ("sglang:kv_transfer_latency_ms_sum",),
        "kv_sent_mib": ("sglang:kv_transfer_total_mb_sum",),
    }

    def knob_args(self, target: Target, station: Station, role: str, tp: int, dp: int, ep: int | None = None,
                  attn_dp: int = 1) -> list[str]:
        """The station's flags for one instance; `ep` and `attn_dp` where the target's topology fixes them (then the
        station's expert-parallel and attention-DP knobs are not rendered: executor/engines/topology.py)."""
        knobs = self.changed_knobs(station.server_knobs)
        eps = ep if ep is not None else ep_size(station, tp)
        argv: list[str] = []
        spec_method, k = None, 0
        for flag, value in knob_flags(knobs, self.knob_key, role):
            if flag == "--disable-radix-cache":
                if value is False:  # the catalog's knob is "enable"; SGLang's flag says "disable"
                    argv.append(flag)
            elif flag == "--init-expert-location":
                if value == "static_eplb":  # this role's own map, fitted for its EP size
                    argv += [flag, static_layout_path(target, station, self.name, role, eps)]
                elif value == "dynamic":  # periodic rebalancing from the recorder's per-expert counts
                    if eps <= 1:  # server_args.py _handle_eplb_and_dispatch: assert ep_size > 1
                        raise FieldError("expert_layout", "dynamic is SGLang's --enable-eplb, which asserts an EP size "
                                         "above 1 (sglang/srt/server_args.py): it needs enable_expert_parallel: "
                                         f"true on more than one card (this instance's EP size is "
                                         f"{eps})")
                    argv += ["--enable-eplb", "--expert-distribution-recorder-mode", "stat"]
            elif flag == "--speculative-algorithm":
                spec_method = value
            elif flag == "--speculative-num-draft-tokens":
                k = int(value)
            elif flag in ("--tp-size", "--dp-size"):
                continue  # from the instance's cards below
            elif ep is not None and flag in ("--ep-size", "--attn-dp-size"):
                continue  # the topology's, below
            elif flag == "--ep-size":
                if value:
                    argv += [flag, str(tp)]  # experts over the TP group
            elif flag == "--attn-dp-size":
                if tp % int(value):
                    raise FieldError("attn_dp_size", f"{value} does not divide the tensor-parallel width {tp}")
                if dp > 1 and int(value) > 1:  # server_args' handle_data_parallelism raises on both above 1
                    raise FieldError("attn_dp_size", f"{value} with data_parallel_size {dp}: SGLang refuses "
                                     "data-parallel replicas combined with attention data parallelism "
                                     "(sglang/srt/arg_groups/parallel_hook.py); set one of them to 1")
                argv += [flag, fmt(value)]
            elif flag == "--chunked-prefill-size":
                argv += [flag, fmt(value)]
                if int(value) > MAX_PREFILL_TOKENS:  # else the prefill batch stays capped at 16384 tokens
                    argv += ["--max-prefill-tokens", fmt(value)]
            elif isinstance(value, bool):
                if value:
                    argv.append(flag)
            else:
                argv += [flag, fmt(value)]
        if tp != 1:
            argv += ["--tp-size", str(tp)]
        if dp != 1:
            argv += ["--dp-size", str(dp)]
        if attn_dp > 1:
            argv += ["--attn-dp-size", str(attn_dp)]
        if ep is not None and ep > 1:
            argv += ["--ep-size", str(ep)]
        if spec_method not in (None, "none") and k > 0:
            # DeepSeek MTP runs as EAGLE with the model's NextN heads: k steps, top-1, k + 1 draft tokens
            argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(k),
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
        return argv

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        if target.topology:  # instances that may span hosts (executor/engines/sglang_groups.py)
            return render_groups(self, target, station)
        services: list[ServiceSpec] = []
        next_port: dict[str, int] = {}
        bootstrap: dict[str, int] = {}  # prefill service -> its bootstrap port
        layout = [(role, i, host, *parallel_sizes(station.server_knobs, host, f"{role} host {host.host}"))
                  for role, i, host in instances(target)]
        for role, i, host, _, _ in layout:
            if target.pd and role == "prefill":
                bootstrap[f"{role}-{i}"] = next_port.get(host.host, BOOTSTRAP_PORT)
                next_port[host.host] = bootstrap[f"{role}-{i}"] + 1
        taken: dict[str, set[int]] = {}  # every port planned per host: services, bootstrap ports, PortArgs blocks
        for h in target.hosts:
            taken.setdefault(h.host, set()).add(h.port)
        for name, port in bootstrap.items():
            taken[next(h for r, i, h, _, _ in layout if f"{r}-{i}" == name).host].add(port)
        attn = int(self.changed_knobs(station.server_knobs).get("attn_dp_size") or 1) > 1
        moved = dist_init_ports([(f"{r}-{i}", h.host, h.port, attn) for r, i, h, _, _ in layout], taken)
        for role, i, host, tp, dp in layout:
            argv = ["python", "-m", "sglang.launch_server", "--model-path", str(target.model),
                    "--host", "0.0.0.0", "--port", str(host.port), "--enable-metrics"]
            trace = f"{svc_dir(target, f'{role}-{i}', host.host)}/trace"
            env = device_env(target, host, "CUDA_VISIBLE_DEVICES") | {"SGLANG_TORCH_PROFILER_DIR": trace}
            if target.pd:
                argv += ["--disaggregation-mode", role,
                         "--disaggregation-transfer-backend", target.pd_connector or "mooncake"]
                port = bootstrap.get(f"{role}-{i}", BOOTSTRAP_PORT)
                if port != BOOTSTRAP_PORT:
                    argv += ["--disaggregation-bootstrap-port", str(port)]
            if f"{role}-{i}" in moved:  # its attention-DP port block, off another's (executor/engines/sglang_ports.py)
                argv += ["--dist-init-addr", f"127.0.0.1:{moved[f'{role}-{i}']}"]
            argv += self.knob_args(target, station, role, tp, dp) + list(target.extra_args.get(role, ()))
            static = station.server_knobs.get("expert_layout") == "static_eplb"
            services.append(ServiceSpec(name=f"{role}-{i}", role=role, host=host.host, port=host.port,
                                        argv=tuple(argv), env=env, cards=host.cards, profile_dir=trace,
                                        expert_ranks=ep_size(station, tp) if static else None))
        return with_router(target, services, "sglang",
                           lambda t, r, ps, ds: router_argv(t, r, ps, ds, bootstrap))

    def pd_router(self, target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec],
                  bootstrap: dict[str, int]) -> list[str]:
        return router_argv(target, router, ps, ds, bootstrap)

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [argv[0] if "python" in argv[0] else python, "-c", PY_VERSION, "sglang"]


ADAPTER = SGLang()
