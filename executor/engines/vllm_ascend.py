"""vLLM-Ascend: `vllm serve` with the Ascend plugin (HEAD of 2026-08 on vLLM 0.32); NPUs by ASCEND_RT_VISIBLE_DEVICES.

PD goes through MooncakeConnectorV1, which asserts on `kv_connector_extra_config` carrying the prefill and the
decode side's tp_size and dp_size and listens from `kv_port` (+ DP rank x TP, + device index), so instances on
one host get kv_port bases 100 apart (vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py,
docs/source/tutorials/features/pd_disaggregation_mooncake_single_node.md). The proxy in front is the example
the vllm-ascend source ships (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py): the
target names it in `router_command`. A static expert map loads by
`--additional-config '{"eplb_config":{"expert_map_path":...}}'` (docs/.../additional_config.md).
"""
from __future__ import annotations

from typing import Any

from core.station import Station
from executor.engines.base import Host, ServiceSpec, static_layout_path
from executor.engines.vllm import Vllm, compact
from executor.targets import Target

MOONCAKE_KV_PORT = 30000  # the tutorial's first instance; each further instance on a host starts 100 above
KV_PORT_STRIDE = 100
PROXY = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"


class VllmAscend(Vllm):
    name = "vllm-ascend"
    knob_key = "vllm"  # the same `vllm serve` flags
    pinned = "vllm-ascend HEAD of 2026-08 on vllm 0.32"
    visible = "ASCEND_RT_VISIBLE_DEVICES"
    connector = "MooncakeConnectorV1"

    def static_layout(self, target: Target, station: Station, pairs: list[tuple[str, Any]]) -> None:
        path = static_layout_path(target, station, self.name)
        pairs.append(("--additional-config", compact({"eplb_config": {"expert_map_path": path}})))

    def kv_transfer(self, role: str, name: str, connector: str, peers: dict[str, tuple[int, int]],
                    slot: int) -> dict[str, Any]:
        kv = super().kv_transfer(role, name, connector, peers, slot)
        if connector != "MooncakeConnectorV1":
            return kv
        sizes = {r: {"tp_size": tp, "dp_size": dp} for r, (tp, dp) in peers.items() if r in ("prefill", "decode")}
        tp, dp = peers[role]
        if tp * dp > KV_PORT_STRIDE:
            raise ValueError(f"tensor_parallel_size: {tp} x {dp} ranks need more than {KV_PORT_STRIDE} Mooncake ports")
        return kv | {"engine_id": name, "kv_port": str(MOONCAKE_KV_PORT + KV_PORT_STRIDE * slot),
                     "kv_connector_extra_config": sizes}

    def router_argv(self, target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
        if not target.router_command:
            raise ValueError(f"router_command: a vllm-ascend PD target names its proxy, e.g. "
                             f"[python3, /opt/vllm-ascend/{PROXY}]")
        argv = [*target.router_command, "--host", "0.0.0.0", "--port", str(router.port),
                "--prefiller-hosts", *[s.host for s in ps], "--prefiller-ports", *[str(s.port) for s in ps],
                "--decoder-hosts", *[s.host for s in ds], "--decoder-ports", *[str(s.port) for s in ds]]
        return argv + list(target.extra_args.get("router", ()))


ADAPTER = VllmAscend()
