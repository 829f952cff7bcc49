"""Card kinds: the peak figures of one accelerator device (core/cards.yaml), what a derived twin prior divides by
(simulator/derive.py) and what a target names as its `card`. A CPU is a card too, measured on its host
(executor/cpu_probe.py), never listed."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from core.errors import FieldError


class Card(BaseModel):
    """One device kind's peaks (core/cards.yaml, or a CPU measured by executor/cpu_probe.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    kind: Literal["gpu", "npu", "cpu"] = "gpu"
    source: str = ""
    devices_per_card: int = Field(1, ge=1)
    memory_gib: float = Field(gt=0)
    mem_bw_gb_s: float = Field(gt=0)
    tflops: dict[str, float]
    link_gb_s: float = Field(gt=0)
    nic_gb_s: float = Field(gt=0)
    link_latency_us: float = Field(ge=0)

    def peak(self, dtype: str) -> float:
        """FLOP/s of a GEMM on weights of this dtype: fp8 and int8 where the card computes them, int4 weights
        unpacked to bf16, else bf16 (a CPU lists its measured fp32 rate only)."""
        t = self.tflops
        want = {"int4": "bf16"}.get(dtype, dtype)
        got = t.get(want) or t.get("bf16") or t.get("fp32")
        if not got:
            raise FieldError("card.tflops", f"{self.name!r} gives no rate for {dtype} nor bf16/fp32")
        return float(got) * 1e12


@lru_cache(maxsize=1)
def cards() -> dict[str, Card]:
    data = yaml.safe_load(Path(__file__).with_name("cards.yaml").read_text())
    return {k: Card(name=k, kind="npu" if k.startswith("Ascend") else "gpu", **v) for k, v in data["cards"].items()}


def card(name: str) -> Card:
    table = cards()
    if name not in table:
        raise FieldError("card", f"{name!r} is not a known card kind (known: {', '.join(sorted(table))}, or cpu)")
    return table[name]


def known() -> list[str]:
    return sorted(cards()) + ["cpu"]
