"""vLLM and vLLM-Ascend instances from a target's topology: every process of every rank, over one host or several.

vLLM (0.32, vllm/entrypoints/cli/serve.py, vllm/engine/arg_utils.py; docs/serving/data_parallel_deployment.md): an
instance whose DP ranks span hosts runs one process per host. The leader (the instance's first host) serves the API
with `--data-parallel-size DP --data-parallel-size-local L --data-parallel-address LEADER --data-parallel-rpc-port R`;
every other host runs `--headless` with the same flags and `--data-parallel-start-rank k x L`, its engine cores
joining the leader over the RPC port. A headless process serves no HTTP: it is healthy when its leader is, flushed
and profiled through it, and its ranks appear in the leader's /metrics under vLLM's `engine` label.

vLLM-Ascend (its P/D guide, docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md, and
examples/external_online_dp/): external DP, one process per DP rank, each with its own API port (the host entry's
port + its local index), its TP cards, `--data-parallel-size DP --data-parallel-rank r --data-parallel-address
LEADER --data-parallel-rpc-port R`; the proxy lists every rank, and each rank is its own scrape endpoint
(`decode-0.r3`). A mixed vLLM-Ascend instance (no proxy in front to spread requests over its ranks) is rendered as
vLLM's own DP above.

Ports per host come from one plan (executor/engines/topology.py `PortPlan`): every API port and the routers' first,
then per instance the DP RPC port on its leader, NIXL's side channel (VLLM_NIXL_SIDE_CHANNEL_PORT + each global DP
rank the process runs: the env is set per process so its ranks land on a free block), MooncakeConnector's bootstrap
port on a prefill leader (TP x DP ports, as vLLM's Mooncake guide counts), vLLM-Ascend's Mooncake kv_port (one per
instance, its ranks at kv_port + DP rank x TP + TP rank, in steps of 100 above AscendDirectTransport's range).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.station import Station
from executor.engines.base import Rendered, ServiceSpec, svc_dir, with_router
from executor.engines.topology import Group, PortPlan, groups, rank_devices
from executor.engines.vllm_connectors import MOONCAKE, MOONCAKE_BOOTSTRAP_PORT, check_connector, env_port, merged
from executor.engines.vllm_jsonargs import _compact, one_json_per_flag
from executor.engines.vllm_nixl import host_memory_nixl, quiet_progress
from executor.targets import Host, Target

DP_RPC_PORT = 29550  # vLLM's default --data-parallel-rpc-port (vllm/config/parallel.py)
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT (vllm/envs.py)


@dataclass(frozen=True)
class Proc:
    """One process of an instance: its host (the k-th of the group), its first global DP rank and rank count, its
    API port, whether it is a headless worker, and its local rank index (external DP) or None."""

    group: Group
    k: int
    host: Host
    first: int
    local: int
    port: int
    headless: bool
    j: int | None

    @property
    def name(self) -> str:
        if self.j is not None:
            return f"{self.group.name}-r{self.first}"
        return self.group.name if self.k == 0 else f"{self.group.name}-n{self.k}"

    @property
    def ranks(self) -> range:
        return range(self.first, self.first + self.local)


def processes(g: Group, external: bool) -> list[Proc]:
    """Every process of one instance: one per DP rank with external DP (vLLM-Ascend, DP > 1), else one per host."""
    out = []
    for k, h in enumerate(g.hosts):
        if external and g.dp > 1:
            out += [Proc(g, k, h, g.start_rank(k) + j, 1, h.port + j, False, j) for j in range(g.local)]
        else:
            out.append(Proc(g, k, h, g.start_rank(k), g.local, h.port, k > 0, None))
    return out


def plan_ports(a: Any, target: Target, gs: list[Group], procs: list[Proc], connector: str,
               external: bool) -> dict[str, Any]:
    """Every planned port: {"rpc": {group: port}, "nixl": {proc: env base}, "boot": {group: port},
    "kv": {group: kv_port}}."""
    plan = PortPlan()
    for p in procs:
        if not p.headless:
            plan.take(p.host.host, [p.port], f"{p.name} --port")
    for r in target.hosts_for("router")[:1] if target.pd else ():
        plan.take(r.host, [r.port], "router-0 --port")
    out: dict[str, Any] = {"rpc": {}, "nixl": {}, "boot": {}, "kv": {}}
    for g in gs:
        mine = [p for p in procs if p.group is g]
        lead = g.leader.host
        if len(g.hosts) > 1 or (external and g.dp > 1):
            rpc = plan.first(DP_RPC_PORT, lambda q: plan.free(lead, [q]))
            plan.take(lead, [rpc], f"{g.name} --data-parallel-rpc-port")
            out["rpc"][g.name] = rpc
        if not target.pd:
            continue
        if connector == "NixlConnector":
            base = env_port(target, "VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_PORT)
            for p in mine:
                start = plan.first(base, lambda q, p=p: plan.free(p.host.host, range(q, q + p.local)))
                plan.take(p.host.host, range(start, start + p.local), f"{p.name} NIXL side channel")
                out["nixl"][p.name] = start - p.first  # the env base: NIXL adds the global DP rank
        if connector == MOONCAKE and g.role == "prefill":
            base = env_port(target, "VLLM_MOONCAKE_BOOTSTRAP_PORT", MOONCAKE_BOOTSTRAP_PORT)
            n = g.tp * g.dp
            boot = plan.first(base, lambda q: plan.free(lead, range(q, q + n)))
            plan.take(lead, range(boot, boot + n), f"{g.name} Mooncake bootstrap")
            out["boot"][g.name] = boot
        kv_base = a.kv_port_start(target)
        if kv_base is not None:
            def spans(q: int, mine: list[Proc] = mine, tp: int = g.tp) -> dict[str, range]:
                return {p.name: range(q + p.first * tp, q + (p.first + p.local) * tp) for p in mine}

            kv = plan.first(kv_base, lambda q: all(plan.free(p.host.host, spans(q)[p.name]) for p in mine), step=100)
            for p in mine:
                plan.take(p.host.host, spans(kv)[p.name], f"{p.name} Mooncake kv_port")
            out["kv"][g.name] = kv
    return out


def render_groups(a: Any, target: Target, station: Station) -> Rendered:
    """Every process of every instance of a target with a topology (see the module's docstring)."""
    connector = target.pd_connector or a.connector
    if target.pd:
        check_connector(connector, a.connectors, a.name)
    gs = groups(target, station)
    external = a.external_dp and target.pd  # a mixed instance has no proxy to spread requests over its ranks
    procs = [p for g in gs for p in processes(g, external)]
    ports = plan_ports(a, target, gs, procs, connector, external)
    peers: dict[str, tuple[int, int]] = {}
    for g in gs:
        peers.setdefault(g.role, (g.tp, g.dp))
    static = station.server_knobs.get("expert_layout") == "static_eplb"
    services: list[ServiceSpec] = []
    for p in procs:
        g = p.group
        argv = [*(target.engine_command or ("vllm",)), "serve", str(target.model)]
        if not p.headless:
            argv += ["--host", "0.0.0.0", "--port", str(p.port)]
        env = dict(target.env) | {"VLLM_SERVER_DEV_MODE": "1"}
        devices = rank_devices(p.host, p.j, g.tp) if p.j is not None else p.host.devices
        if devices:
            env[a.visible] = devices
        files: dict[str, str] = {}
        if target.pd:
            kv = merged(a.group_kv(target, g.role, g.name, connector, peers, ports["kv"].get(g.name)),
                        target.pd_connector_config)
            argv += ["--kv-transfer-config", _compact(kv)]
            if p.name in ports["nixl"]:
                env |= a.pd_env(p.host, connector, ports["nixl"][p.name])
            if host_memory_nixl(kv, connector):  # as a one-host instance: NIXL's progress thread would spin a core
                files, shim_env = quiet_progress(svc_dir(target, p.name, p.host.host), env)
                env |= shim_env
            if g.name in ports["boot"]:
                env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(ports["boot"][g.name])
        trace = f"{svc_dir(target, p.name, p.host.host)}/trace"
        argv += a.knob_args(target, station, g.role, p.host, g.tp, g.dp, ep_on=g.ep > 1)
        if g.name in ports["rpc"]:
            argv += (["--data-parallel-rank", str(p.first)] if p.j is not None else
                     ["--data-parallel-size-local", str(g.local)])
            argv += ["--data-parallel-address", g.leader.host, "--data-parallel-rpc-port", str(ports["rpc"][g.name])]
            if p.headless:
                argv += ["--headless", "--data-parallel-start-rank", str(p.first)]
        env |= a.layout_env(target, station)
        argv += ["--profiler-config", _compact({"profiler": "torch", "torch_profiler_dir": trace})]
        argv = one_json_per_flag(argv, list(target.extra_args.get(g.role, ())), f"extra_args.{g.role}")
        follower = {"leader": g.name, "health_host": g.leader.host, "health_port": g.leader.port} if p.headless else {}
        services.append(ServiceSpec(
            name=p.name, role=g.role, host=p.host.host, port=p.port, argv=tuple(argv), env=env, files=files,
            cards=g.tp * p.local, profile_dir=None if p.headless else trace,
            expert_ranks=g.tp * g.dp if static else None,
            metrics_name=f"{g.name}.r{p.first}" if p.j is not None else None, **follower))
    return with_router(target, services, a.name, a.router_argv, a.router_health)
