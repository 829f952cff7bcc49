"""SGLang instances from a target's topology: one process per host of each instance, with SGLang's multi-node flags.

SGLang 0.5.23 (sglang/srt/server_args.py, srt/arg_groups/parallel_hook.py and validation_hook.py): an instance is
one tensor-parallel world of TP x DP cards (`--tp-size`), its DP ranks attention-DP groups (`--attn-dp-size DP`;
SGLang refuses data-parallel replicas across nodes: "multi-node data-parallel replicas are not supported; use
attention DP (--attn-dp-size) across nodes"), its experts over all ranks (`--ep-size TP x DP`). Over several hosts
each host runs `--nnodes N --node-rank k --dist-init-addr LEADER:P`; node 0 serves the API, binds P and the six
PortArgs ports above it and, across nodes, the worker-port handshake at P + 13; a node above 0 serves /health and
/metrics on its own `--port` (`launch_dummy_health_check_server`), so each node is a scrape endpoint
(`decode-0.n1`) and is flushed and profiled through node 0. A prefill's bootstrap server runs on node 0; every node
is told its port.

Ports per host come from one plan (executor/engines/topology.py `PortPlan`): every node's --port and the router's
first, then per instance the prefill bootstrap port (8998 and up) and the PortArgs block (from --port + 233, as
SGLang's default, moved up to the first free block; on one host a moved block is `--dist-init-addr 127.0.0.1:P`, as
executor/engines/sglang_ports.py renders it).
"""
from __future__ import annotations

from typing import Any

from core.station import Station
from executor.engines.base import Rendered, ServiceSpec, svc_dir, with_router
from executor.engines.sglang_ports import PORT_ARGS_BLOCK, ZMQ_TCP_PORT_DELTA
from executor.engines.topology import DP_ATTENTION_HANDSHAKE_PORT_DELTA, Group, PortPlan, groups
from executor.targets import Target

BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port


def _block(start: int, nodes: int) -> list[int]:
    """The ports node 0 binds from the dist-init port: the PortArgs block, and across nodes the handshake."""
    return [*range(start, start + PORT_ARGS_BLOCK), *([start + DP_ATTENTION_HANDSHAKE_PORT_DELTA] if nodes > 1 else [])]


def plan_ports(target: Target, gs: list[Group]) -> tuple[dict[str, int], dict[str, int]]:
    """({instance: bootstrap port} of each prefill instance, {instance: dist-init port} of each with attention DP)."""
    plan = PortPlan()
    for g in gs:
        for k, h in enumerate(g.hosts):
            plan.take(h.host, [h.port], f"{g.name} node {k} --port")
    for r in target.hosts_for("router")[:1] if target.pd else ():
        plan.take(r.host, [r.port], "router-0 --port")
    boot: dict[str, int] = {}
    init: dict[str, int] = {}
    for g in gs:
        lead = g.leader.host
        if target.pd and g.role == "prefill":
            boot[g.name] = plan.first(BOOTSTRAP_PORT, lambda q: plan.free(lead, [q]))
            plan.take(lead, [boot[g.name]], f"{g.name} bootstrap server")
        if g.dp > 1:
            n = len(g.hosts)
            init[g.name] = plan.first(g.leader.port + ZMQ_TCP_PORT_DELTA, lambda q: plan.free(lead, _block(q, n)))
            plan.take(lead, _block(init[g.name], n), f"{g.name} PortArgs block")
    return boot, init


def render_groups(a: Any, target: Target, station: Station) -> Rendered:
    """Every process of every instance of a target with a topology (see the module's docstring)."""
    gs = groups(target, station)
    boot, init = plan_ports(target, gs)
    static = station.server_knobs.get("expert_layout") == "static_eplb"
    services: list[ServiceSpec] = []
    for g in gs:
        nodes = len(g.hosts)
        for k, h in enumerate(g.hosts):
            name = g.name if k == 0 else f"{g.name}-n{k}"
            argv = ["python", "-m", "sglang.launch_server", "--model-path", str(target.model),
                    "--host", "0.0.0.0", "--port", str(h.port), "--enable-metrics"]
            trace = f"{svc_dir(target, name, h.host)}/trace"
            env = dict(target.env) | {"SGLANG_TORCH_PROFILER_DIR": trace}
            if h.devices:
                env["CUDA_VISIBLE_DEVICES"] = h.devices
            if target.pd:
                argv += ["--disaggregation-mode", g.role,
                         "--disaggregation-transfer-backend", target.pd_connector or "mooncake"]
                if boot.get(g.name, BOOTSTRAP_PORT) != BOOTSTRAP_PORT:
                    argv += ["--disaggregation-bootstrap-port", str(boot[g.name])]
            if nodes > 1:
                argv += ["--nnodes", str(nodes), "--node-rank", str(k)]
            if g.name in init and (nodes > 1 or init[g.name] != g.leader.port + ZMQ_TCP_PORT_DELTA):
                argv += ["--dist-init-addr", f"{g.leader.host if nodes > 1 else '127.0.0.1'}:{init[g.name]}"]
            argv += a.knob_args(target, station, g.role, g.tp * g.dp, 1, ep=g.ep, attn_dp=g.dp)
            argv += list(target.extra_args.get(g.role, ()))
            follower = {"leader": g.name, "metrics_name": f"{g.name}.n{k}"} if k else {}
            services.append(ServiceSpec(name=name, role=g.role, host=h.host, port=h.port, argv=tuple(argv), env=env,
                                        cards=h.cards, profile_dir=None if k else trace,
                                        expert_ranks=g.ep if static else None, **follower))
    return with_router(target, services, a.name, lambda t, r, ps, ds: a.pd_router(t, r, ps, ds, boot))
