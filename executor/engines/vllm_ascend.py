"""vLLM-Ascend: `vllm serve` with the Ascend plugin; PD through MooncakeConnectorV1, NPUs by ASCEND_RT_VISIBLE_DEVICES."""
from __future__ import annotations

from executor.engines.vllm import Vllm


class VllmAscend(Vllm):
    name = "vllm-ascend"
    knob_key = "vllm"  # the same `vllm serve` flags
    pinned = "vllm-ascend HEAD of 2026-08 on vllm 0.32"
    visible = "ASCEND_RT_VISIBLE_DEVICES"
    connector = "MooncakeConnectorV1"


ADAPTER = VllmAscend()
