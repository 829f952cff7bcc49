"""vLLM-Ascend: `vllm serve` with the Ascend plugin (HEAD of 2026-08 on vLLM 0.32); NPUs by ASCEND_RT_VISIBLE_DEVICES.

PD goes through MooncakeConnectorV1, which asserts on `kv_connector_extra_config` carrying the prefill and the
decode side's tp_size and dp_size and listens from `kv_port` (+ DP rank x TP, + device index), so instances on
one host get kv_port bases 100 apart, all above the ports Mooncake's AscendDirectTransport picks at random
(vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py,
docs/source/tutorials/features/pd_disaggregation_mooncake_single_node.md). The proxy in front is the example
the vllm-ascend source ships (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py): the
target names it in `router_command`; it answers `GET /healthcheck` (it has no /health). A static expert map loads by
`--additional-config '{"eplb_config":{"expert_map_path":...}}'` (docs/.../additional_config.md).

The network interfaces HCCL, Gloo and TensorPipe use are the operator's: vllm-ascend's PD tutorials export
HCCL_IF_IP, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME and HCCL_SOCKET_IFNAME on every node, and only the operator knows
the node's address and NIC name. A PD rendering whose target env leaves any of them unset carries a warning naming
each missing one (the deploy phase records it); it is not refused, since a single-node PD can run on the defaults.
"""
from __future__ import annotations

from typing import Any

from core.errors import FieldError
from core.station import Station
from executor.engines.base import Host, Rendered, ServiceSpec, static_layout_path
from executor.engines.vllm import Vllm, compact, need_expert_ranks
from executor.targets import Target

# Mooncake's AscendDirectTransport takes random ports in [20000, 20000 + NPUs per node x 1000) (vllm-ascend's
# docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md, "kv_port Configuration Guide": 20000-27999
# on 8 NPUs, 20000-35999 on 16, "Address already in use" at start when kv_port falls inside), so the first kv_port
# of a host sits above that range for the host's NPU count: at least A3's 16 NPUs per node (the most an Ascend node
# has; a target's cards and device ids do not say how many NPUs the node holds), more when its device ids go higher
TRANSPORT_PORT_BASE = 20000
TRANSPORT_PORTS_PER_NPU = 1000
NODE_NPUS = 16
KV_PORT_STRIDE = 100  # each further instance on a host starts 100 above (an instance takes kv_port + its ranks)
PROXY = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
# What each interface variable picks; vllm-ascend's docs/source/tutorials/features/
# pd_disaggregation_mooncake_single_node.md and pd_disaggregation_mooncake_multi_node.md set all four per node
# ("node ip", "network card name"). Unset, each library picks an interface itself, which on a multi-NIC node can
# be one the peers cannot reach.
HCCL_NETWORK_ENV = {
    "HCCL_IF_IP": "the node's IP address HCCL binds its host-side socket to (bootstrapping the NPU communicators)",
    "GLOO_SOCKET_IFNAME": "the network interface torch.distributed's Gloo (CPU) process groups use",
    "TP_SOCKET_IFNAME": "the network interface torch's TensorPipe RPC uses",
    "HCCL_SOCKET_IFNAME": "the network interface HCCL's host-side socket uses",
}


def hccl_network_warning(target: Target) -> str | None:
    """The warning a PD target gets when its env leaves HCCL's / Gloo's / TensorPipe's interfaces unset (None when
    it sets all four). The target's env is the only env a rendering sees (hosts carry none): a variable set in the
    hosts' own environment is not seen here, which is why this is a warning that names that place too, not a
    refusal."""
    missing = [k for k in HCCL_NETWORK_ENV if not target.env.get(k)]
    if not missing:
        return None
    what = "; ".join(f"{k}: {HCCL_NETWORK_ENV[k]}" for k in missing)
    return (f"vllm-ascend PD: the target's env does not set {', '.join(missing)}. tuneloop leaves the network "
            f"interfaces to the operator and invents no values ({what}). Unset, each library picks an interface "
            "itself, which on a node with several NICs can be one the peers cannot reach; a single-node PD can run "
            "without them. Set them in the target's env (or in the hosts' own environment) as vllm-ascend's "
            "PD tutorials do.")


def model_runner_v2(target: Target) -> bool:
    """Whether the target selects vLLM's Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER, as vllm-ascend's EPLB guide
    exports it); vllm-ascend's own EPLB switches differ by runner."""
    return target.env.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() in ("1", "true")


def kv_port_base(target: Target) -> int:
    """The first Mooncake kv_port on every host: above AscendDirectTransport's range for the most NPUs any host
    of the target may hold (NODE_NPUS, or its highest device id + 1 where that is more)."""
    ids = [int(d) for h in target.hosts for d in (h.devices or "").split(",") if d.strip().isdigit()]
    npus = max([NODE_NPUS, *(i + 1 for i in ids)])
    return TRANSPORT_PORT_BASE + TRANSPORT_PORTS_PER_NPU * npus


class VllmAscend(Vllm):
    name = "vllm-ascend"
    knob_key = "vllm"  # the same `vllm serve` flags
    pinned = "vllm-ascend HEAD of 2026-08 on vllm 0.32"
    visible = "ASCEND_RT_VISIBLE_DEVICES"
    connector = "MooncakeConnectorV1"
    connectors = ("MooncakeConnectorV1",)  # vllm-ascend's own Mooncake connector, the one its PD guides run
    router_health = "/healthcheck"  # the proxy serves GET /healthcheck, not /health (PROXY, @app.get("/healthcheck"))

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        rendered = super().render(target, station, faults, expected_requests)
        warning = hccl_network_warning(target) if target.pd else None
        return rendered.model_copy(update={"warnings": (*rendered.warnings, warning)}) if warning else rendered

    def role_draft(self, target: Target, role: str, spec: dict[str, Any]) -> dict[str, Any]:
        """MTP on prefill drafts 1 token, on decode the station's width: vllm-ascend's P/D guide
        (docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md: "num_speculative_tokens on P nodes
        should be 1, and num_speculative_tokens on D nodes should be greater or equal to 1"; its PD launches run
        1 on P), unlike vLLM's NIXL, which needs both sides equal. The guide's exception, hybrid Mamba models
        (Qwen-Next, Qwen3.5) with equal widths, is not rendered here."""
        if target.pd and role == "prefill" and spec.get("num_speculative_tokens"):
            return spec | {"num_speculative_tokens": 1}
        return spec

    def static_layout(self, target: Target, station: Station, pairs: list[tuple[str, Any]], role: str,
                      ranks: int) -> None:
        """The role's own map, fitted for its TP x DP ranks: Model Runner V1 only (V2 refuses expert_map_path,
        vllm_ascend/platform.py)."""
        if model_runner_v2(target):
            raise FieldError("expert_layout", "static_eplb loads eplb_config.expert_map_path, which vllm-ascend's Model "
                             "Runner V2 refuses (vllm_ascend/platform.py); unset env.VLLM_USE_V2_MODEL_RUNNER")
        path = static_layout_path(target, station, self.name, role, ranks)
        pairs.append(("--additional-config", compact({"eplb_config": {"expert_map_path": path}})))

    def dynamic_layout(self, target: Target, station: Station, pairs: list[tuple[str, Any]], ranks: int) -> None:
        """vllm-ascend's own switches (docs/source/user_guide/feature_guide/expert_parallelism_load_balancer.md,
        vllm_ascend/platform.py): on Model Runner V1 (its default) `--enable-eplb` raises "Upstream EPLB is only
        supported by Model Runner V2", and dynamic EPLB is `eplb_config.dynamic_eplb` with DYNAMIC_EPLB=true (the
        guard vllm_ascend/ascend_config.py asserts); on V2 (VLLM_USE_V2_MODEL_RUNNER=1 in the target's env) it is
        vLLM's `--enable-eplb`, synchronous (V2 refuses `use_async`, vLLM's default)."""
        need_expert_ranks(station, ranks, "vllm-ascend's dynamic EPLB")
        if model_runner_v2(target):
            pairs += [("--enable-eplb", True), ("--eplb-config", compact({"use_async": False}))]
        else:
            pairs.append(("--additional-config", compact({"eplb_config": {"dynamic_eplb": True}})))

    def layout_env(self, target: Target, station: Station) -> dict[str, str]:
        """DYNAMIC_EPLB=true with dynamic EPLB on Model Runner V1 (its config asserts it); V2 refuses it."""
        dynamic = station.server_knobs.get("expert_layout") == "dynamic"
        return {"DYNAMIC_EPLB": "true"} if dynamic and not model_runner_v2(target) else {}

    def kv_transfer(self, target: Target, role: str, name: str, connector: str, peers: dict[str, tuple[int, int]],
                    slot: int) -> dict[str, Any]:
        kv = super().kv_transfer(target, role, name, connector, peers, slot)
        if connector != "MooncakeConnectorV1":
            return kv
        sizes = {r: {"tp_size": tp, "dp_size": dp} for r, (tp, dp) in peers.items() if r in ("prefill", "decode")}
        tp, dp = peers[role]
        if tp * dp > KV_PORT_STRIDE:
            raise FieldError("tensor_parallel_size", f"{tp} x {dp} ranks need more than {KV_PORT_STRIDE} Mooncake ports")
        return kv | {"engine_id": name, "kv_port": str(kv_port_base(target) + KV_PORT_STRIDE * slot),
                     "kv_connector_extra_config": sizes}

    external_dp = True  # its P/D guide runs one process per DP rank (examples/external_online_dp)

    def kv_port_start(self, target: Target) -> int | None:
        connector = target.pd_connector or self.connector
        return kv_port_base(target) if target.pd and connector == "MooncakeConnectorV1" else None

    def group_kv(self, target: Target, role: str, name: str, connector: str, peers: dict[str, tuple[int, int]],
                 kv_port: int | None) -> dict[str, Any]:
        """An instance of the target's topology: its kv_port planned per host (its ranks at kv_port + DP rank x TP
        + TP rank), the P and D sizes Mooncake asserts on, its engine id (vLLM appends each rank's _dp<r>)."""
        kv = Vllm.kv_transfer(self, target, role, name, connector, peers, 0)
        if connector != "MooncakeConnectorV1":
            return kv
        sizes = {r: {"tp_size": tp, "dp_size": dp} for r, (tp, dp) in peers.items() if r in ("prefill", "decode")}
        return kv | {"engine_id": name, "kv_port": str(kv_port), "kv_connector_extra_config": sizes}

    def router_argv(self, target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
        if not target.router_command:
            raise FieldError("router_command", f"a vllm-ascend PD target names its proxy, e.g. "
                             f"[python3, /opt/vllm-ascend/{PROXY}]")
        argv = [*target.router_command, "--host", "0.0.0.0", "--port", str(router.port),
                "--prefiller-hosts", *[s.host for s in ps], "--prefiller-ports", *[str(s.port) for s in ps],
                "--decoder-hosts", *[s.host for s in ds], "--decoder-ports", *[str(s.port) for s in ds]]
        return argv + list(target.extra_args.get("router", ()))


ADAPTER = VllmAscend()
