"""Instances as groups of ranks that may span hosts, and the port plan every such deployment is rendered against.

A target's `topology` (executor/targets.py `RoleTopology`, docs/topologies.md) shapes a role's instances: TP x DP
ranks each, `dp_local` DP ranks per host, so one instance spans dp / dp_local of the role's host entries (in order).
A role without one keeps the one-instance-per-host-entry form (executor/engines/base.py `instances`), sized by the
station's parallel knobs; both forms meet here as `Group`s. The topology fixes the role's TP, DP and EP: a station
that sets one of those knobs to another value is refused, naming the knob.

`PortPlan` holds every port planned on each host (service ports, an engine's fixed blocks, per-rank offsets, the
DP RPC port, the routers' ports) and hands out blocks that never overlap one already taken. `listening_ports`
reads a rendered deployment back, process by process, into the ports each engine binds by its own rules (the
facts each adapter cites), so a test can list them per host and hold that no two processes claim one port.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from core.errors import FieldError
from core.station import Station
from executor.engines.base import Rendered, ServiceSpec, instances, parallel_sizes
from executor.targets import Host, Target


@dataclass(frozen=True)
class Group:
    """One engine instance: its role and index, its host entries (the first is its leader), TP and DP ranks, DP
    ranks per host and its expert-parallel size (1: experts not sharded)."""

    role: str
    index: int
    hosts: tuple[Host, ...]
    tp: int
    dp: int
    local: int
    ep: int
    shaped: bool  # from the target's topology (False: one host entry sized by the station's knobs)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def leader(self) -> Host:
        return self.hosts[0]

    def start_rank(self, k: int) -> int:
        """The first DP rank on the group's k-th host."""
        return k * self.local


def _refuse_knob(knobs: dict[str, Any], name: str, value: Any, default: Any, role: str, shape: str) -> None:
    given = knobs.get(name)
    if given is not None and given != default and given != value:
        raise FieldError(name, f"{given} differs from the target's topology.{role}, which fixes {shape}; the "
                         "topology is the target's, not the station's to change")


def groups(target: Target, station: Station) -> list[Group]:
    """Every engine instance, prefill then decode for a PD target, else the mixed role."""
    knobs = station.server_knobs
    ep_on = bool(knobs.get("enable_expert_parallel"))
    out: list[Group] = []
    for role, i, host in instances(target):
        if target.topology_of(role) is None:
            tp, dp = parallel_sizes(knobs, host, f"{role} host {host.host}")
            out.append(Group(role, i, (host,), tp, dp, dp, tp * dp if ep_on else 1, False))
    for role in (("prefill", "decode") if target.pd else ("mixed",)):
        t = target.topology_of(role)
        if t is None:
            continue
        shape = f"TP {t.tp} x DP {t.dp}"
        _refuse_knob(knobs, "tensor_parallel_size", t.tp, None, role, shape)
        _refuse_knob(knobs, "data_parallel_size", t.dp, 1, role, shape)
        _refuse_knob(knobs, "attn_dp_size", t.dp, 1, role, shape)
        ep = t.ep if t.ep is not None else (t.tp * t.dp if ep_on else 1)
        if ep_on and ep == 1 and t.tp * t.dp > 1:
            raise FieldError("enable_expert_parallel", f"true, but the target's topology.{role} fixes ep: 1")
        entries = target.hosts_for(role)
        for i in range(t.instances):
            hosts = tuple(entries[i * t.hosts_each:(i + 1) * t.hosts_each])
            out.append(Group(role, i, hosts, t.tp, t.dp, t.local, ep, True))
    order = {"prefill": 0, "decode": 1, "mixed": 2}
    return sorted(out, key=lambda g: (order[g.role], g.index))


def shaped_knobs(station: Station, g: Group) -> dict[str, Any]:
    """The station's knobs with the group's shape in them (the adapters render TP / DP / EP from the group)."""
    knobs = dict(station.server_knobs)
    if g.shaped:
        knobs["enable_expert_parallel"] = g.ep > 1
        knobs["attn_dp_size"] = 1  # an adapter renders the group's DP its own way
    return knobs


def rank_devices(host: Host, j: int, width: int) -> str:
    """The device ids of the j-th block of `width` cards on a host entry (its `devices`, else 0..cards-1)."""
    ids = [d for d in (host.devices or "").split(",") if d] or [str(n) for n in range(host.cards)]
    return ",".join(ids[j * width:(j + 1) * width])


class PortPlan:
    """Every port planned per host, and what takes it; `take` refuses an overlap naming both claimants."""

    def __init__(self) -> None:
        self.used: dict[str, dict[int, str]] = {}

    def free(self, host: str, ports: Iterable[int]) -> bool:
        held = self.used.get(host, {})
        return all(1 <= p <= 65535 and p not in held for p in ports)

    def take(self, host: str, ports: Iterable[int], what: str) -> None:
        held = self.used.setdefault(host, {})
        for p in ports:
            if not 1 <= p <= 65535:
                raise FieldError("hosts", f"{what} on {host} needs port {p}, outside 1-65535")
            if p in held:
                raise FieldError("hosts", f"{what} on {host} needs port {p}, which {held[p]} takes")
            held[p] = what

    def first(self, start: int, fits: Any, step: int = 1) -> int:
        """The first port from `start` (by `step`) for which `fits(port)` holds."""
        p = start
        while not fits(p):
            p += step
            if p > 65535:
                raise FieldError("hosts", f"no free port block above {start}")
        return p


# -- reading a rendered deployment back into the ports its processes bind ------------------------------------------

def _after(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _int(argv: tuple[str, ...], flag: str, default: int) -> int:
    v = _after(argv, flag)
    return int(v) if v is not None else default


ZMQ_TCP_PORT_DELTA = 233  # SGLang: PortArgs' default dist-init port above --port (sglang/srt/server_args.py)
DP_ATTENTION_HANDSHAKE_PORT_DELTA = 13  # SGLang: node 0's worker-port broadcast above the dist-init port


def _sglang(svc: ServiceSpec) -> list[tuple[int, str]]:
    """SGLang 0.5.23 (server_args.py `PortArgs.init_new`, data_parallel_controller.py): --port on every node (node
    ranks above 0 serve /health and /metrics there); with attention DP, node 0 binds the dist-init port and the six
    derived ports above it, and across nodes the worker-port handshake at dist-init + 13; a prefill's node 0 its
    bootstrap server."""
    a = svc.argv
    out = [(svc.port, "--port")]
    node = _int(a, "--node-rank", 0)
    if node == 0 and _int(a, "--attn-dp-size", 1) > 1:
        addr = _after(a, "--dist-init-addr")
        base = int(addr.rsplit(":", 1)[1]) if addr else svc.port + ZMQ_TCP_PORT_DELTA
        out += [(base + k, "PortArgs dist-init" if k == 0 else f"PortArgs port_base+{k - 1}") for k in range(7)]
        if _int(a, "--nnodes", 1) > 1:
            out.append((base + DP_ATTENTION_HANDSHAKE_PORT_DELTA, "DP-attention worker-port handshake"))
    if node == 0 and _after(a, "--disaggregation-mode") == "prefill":
        out.append((_int(a, "--disaggregation-bootstrap-port", 8998), "bootstrap server"))
    return out


def _vllm(svc: ServiceSpec) -> list[tuple[int, str]]:
    """vLLM 0.32: the API port unless headless; NIXL's side channel at VLLM_NIXL_SIDE_CHANNEL_PORT + each global DP
    rank the process runs (nixl/base_scheduler.py); MooncakeConnector's bootstrap server where this process runs
    DP rank 0 of its instance; DP's RPC port on the process that serves the instance across nodes; vllm-ascend's
    Mooncake handshake at kv_port + DP rank x TP + TP rank (kv_p2p/mooncake_connector.py)."""
    a, env = svc.argv, svc.env
    out = [] if "--headless" in a else [(svc.port, "--port")]
    tp = _int(a, "--tensor-parallel-size", 1)
    if "--data-parallel-rank" in a:  # external DP: one rank per process
        first, local = _int(a, "--data-parallel-rank", 0), 1
    else:
        first = _int(a, "--data-parallel-start-rank", 0)
        local = _int(a, "--data-parallel-size-local", _int(a, "--data-parallel-size", 1))
    ranks = range(first, first + local)
    if "VLLM_NIXL_SIDE_CHANNEL_PORT" in env:
        base = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        out += [(base + r, f"NIXL side channel (DP rank {r})") for r in ranks]
    if "VLLM_MOONCAKE_BOOTSTRAP_PORT" in env and first == 0 and "--headless" not in a:
        out.append((int(env["VLLM_MOONCAKE_BOOTSTRAP_PORT"]), "Mooncake bootstrap server"))
    kv = _after(a, "--kv-transfer-config")
    if kv is not None and "kv_port" in json.loads(kv):
        base = int(json.loads(kv)["kv_port"])
        out += [(base + r * tp + t, f"Mooncake handshake (DP rank {r}, TP rank {t})") for r in ranks for t in range(tp)]
    multi = "--data-parallel-address" in a and "--headless" not in a and first == 0
    if multi:
        out.append((_int(a, "--data-parallel-rpc-port", 29550), "DP RPC (--data-parallel-rpc-port)"))
    return out


def _router(svc: ServiceSpec) -> list[tuple[int, str]]:
    out = [(svc.port, "router --port")]
    if "--prometheus-port" in svc.argv:
        out.append((_int(svc.argv, "--prometheus-port", 0), "router --prometheus-port"))
    return out


def listening_ports(rendered: Rendered) -> dict[str, list[tuple[int, str]]]:
    """{host: [(port, "service: what")]} of every fixed port every process of a rendered deployment binds, read
    from its argv and env by each engine's own rules (ports an engine picks at random at start are not listed)."""
    read = {"sglang": _sglang, "vllm": _vllm, "vllm-ascend": _vllm}[rendered.engine]
    out: dict[str, list[tuple[int, str]]] = {}
    for s in rendered.services:
        for port, what in (_router(s) if s.role == "router" else read(s)):
            out.setdefault(s.host, []).append((port, f"{s.name}: {what}"))
    return {h: sorted(v) for h, v in out.items()}
