"""Profiles: a simulated deployment as data (layout, engine defaults, step-time coefficients, costs).

A profile YAML in core/profiles/ (or any path) says how many prefill/decode instances there are,
what an engine does when a knob is not given (`defaults`), where the field report started
(`start_knobs`), and the coefficients of the step-time shapes published by DistServe, Vidur and aiconfigurator.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core import datafiles
from core.errors import FieldError
from core.knobs import catalog


class Role(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    instances: int = Field(ge=1)
    cards_per_instance: int = Field(ge=1)
    dp: int = Field(1, ge=1)  # data-parallel ranks per instance, stepping in lockstep


class PrefillCost(BaseModel):
    """t_P = a + b·Σn + c·Σ n·(ctx + n/2) per DP rank; the slowest rank sets the step."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    a: float = Field(ge=0)
    b: float = Field(ge=0)
    c: float = Field(ge=0)
    sched_s: float = Field(0.0, ge=0)  # host-side scheduling per step (part of a, reported apart)
    comm_share: float = Field(0.2, ge=0, le=1)  # share of compute time that is collective communication
    prefix_cache_tokens: int = Field(ge=0)  # per instance


class DecodeCost(BaseModel):
    """t_D = (a + b·B·(k+1) + c·ΣKV)·IF + k·(a_draft + b_draft·B), IF = MoE imbalance (max/mean EP-rank load:
    if_static[layout], the layout's persistent routing skew, times the expected max of a step's routings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    a: float = Field(ge=0)
    b: float = Field(ge=0)
    c: float = Field(ge=0)
    a_draft: float = Field(0.0, ge=0)
    b_draft: float = Field(0.0, ge=0)
    sched_s: float = Field(0.0, ge=0)
    comm_share: float = Field(0.2, ge=0, le=1)
    ep: int = Field(1, ge=1)  # expert-parallel ranks (1 = dense model: no imbalance term)
    topk: int = Field(1, ge=1)
    # per expert_layout: none (the engine's own placement), static_eplb (a fitted map), dynamic (dynamic EPLB,
    # rebalanced from live statistics: as flat as a fitted map unless the profile measures it)
    if_static: dict[str, float] = {"none": 1.0, "static_eplb": 1.0}
    index_cache_reuse_saving: float = Field(0.0, ge=0, lt=1)  # share of a+c time saved
    kv_tokens_at_full_memory: int = Field(ge=1)  # KV tokens per instance if all free memory held KV
    weights_memory_fraction: float = Field(ge=0, lt=1)  # of device memory, per card

    def skew(self, layout: str) -> float:
        """The layout's persistent max/mean EP-rank load (1.0 where the profile gives none)."""
        if layout == "dynamic" and "dynamic" not in self.if_static:
            layout = "static_eplb"
        return self.if_static.get(layout, 1.0)


class Transfer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    latency_s: float = Field(ge=0)
    kv_bytes_per_token: float = Field(ge=0)
    bandwidth_gb_s: float = Field(gt=0)
    overlap: float = Field(0.5, ge=0, le=1)  # share of the transfer hidden behind the last chunk
    serial: bool = False  # True: transfers into one decode instance share its link and queue (bandwidth-bound)


class Costs(BaseModel):
    """Device seconds the executor charges for each kind of change."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    restart_s: float = Field(ge=0)
    weight_load_s: float = Field(ge=0)
    warmup_s: float = Field(ge=0)
    relayout_s: float = Field(ge=0)


class QualityModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    baseline: float = Field(gt=0, le=1)  # accuracy of the unmodified model on the eval set
    tolerance: float = Field(ge=0)  # largest drop that still passes
    index_cache_reuse_drop: float = Field(ge=0)
    noise: float = Field(0.0, ge=0)


class Deployment(BaseModel):
    """What a profile's deployment is, beside its coefficients: the served model's config (Hugging Face config.json
    keys), the card kind, the engine and the KV transport. Enough to derive a prior for it from first principles
    (simulator/derive.py: `tuneloop sim derive --profile NAME`, the bench's derived-prior mode); never read by the
    simulator itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: dict[str, Any]
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] | None = None  # else the config's
    kv_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8"] | None = None  # else bf16 (fp32 for fp32 weights)
    card: str  # a card kind of core/cards.yaml
    engine: str = "vllm"
    transport: Literal["rdma", "tcp", "local"] = "rdma"
    graphs: bool = True  # decode steps replayed from captured graphs
    note: str = ""  # where the model's shape came from, when it is an assumption


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    default_task: str = "copy"  # MTP acceptance used when the caller does not say (HTTP mode)
    prefill: Role
    decode: Role
    defaults: dict[str, Any]  # engine defaults for server knobs (catalog names)
    start_knobs: dict[str, Any] = {}  # the starting station (server + load knobs)
    prefill_cost: PrefillCost
    decode_cost: DecodeCost
    transfer: Transfer
    acceptance: dict[str, float]  # MTP acceptance α of the first draft position, by task type
    # conditional acceptance of draft position i is α·decay^(i-1): 1.0 = the same α at every position
    acceptance_decay: float = Field(1.0, gt=0, le=1)
    costs: Costs
    quality: QualityModel
    noise_run_sigma: float = Field(0.012, ge=0)
    noise_step_sigma: float = Field(0.01, ge=0)
    calibration: dict[str, Any] | None = None  # provenance of fitted coefficients (simulator.calibrate)
    # the served model's prompt tokens per request: fixed + per_word × the scenario's words (its tokenizer and chat
    # template; 1 and 0 = the simulator's own count, a token per word); a calibrated profile carries what its runs
    # measured, so a prediction sends the prompts the engine saw (simulator.engine.tokenized)
    prompt_tokens_per_word: float = Field(1.0, gt=0)
    prompt_tokens_fixed: float = Field(0.0, ge=0)
    # one engine per instance that prefills and decodes in the same steps (vLLM, SGLang without disaggregation):
    # a step carries the running requests' decode tokens and, in the token budget left, chunks of waiting prompts;
    # its time is t_D + [a chunk in it]·a_P + b_P·Σn + c_P·Σn(ctx + n/2) (simulator.mixed). The prefill role must
    # then mirror the decode role (the same engines drawn twice); the cards are the decode role's.
    mixed: bool = False
    deployment: Deployment | None = None  # what the deployment is (model, card, engine), for a derived prior
    derived: dict[str, Any] | None = None  # a derived prior's provenance (simulator/derive.py): origin and its rows

    @model_validator(mode="after")
    def _knobs_in_catalog(self) -> "Profile":
        cat = catalog()
        cat.validate(self.defaults, engine="sim")
        cat.validate(self.start_knobs, engine="sim")
        for task in ("copy", "chat", "code"):
            if not 0.0 <= self.acceptance.get(task, -1.0) < 1.0:
                raise FieldError(f"acceptance.{task}", "must be given in [0, 1)")
        if self.mixed and (self.prefill.instances != self.decode.instances or self.prefill.dp != 1):
            raise FieldError("mixed", "the prefill role must have as many instances as the decode role and dp 1 "
                             "(one engine does both)")
        return self

    def knobs(self, overrides: dict[str, Any] | None = None, start: bool = False) -> dict[str, Any]:
        """Effective knobs: catalog defaults < profile engine defaults (< start_knobs) < overrides."""
        cat = catalog()
        base = cat.defaults("sim") | {"num_prefill_instances": self.prefill.instances,
                                      "num_decode_instances": self.decode.instances} | self.defaults
        if start:
            base |= self.start_knobs
        return base | cat.validate(dict(overrides or {}), engine="sim")

    def cards(self, knobs: dict[str, Any]) -> int:
        if self.mixed:
            return int(knobs["num_decode_instances"]) * self.decode.cards_per_instance
        return (int(knobs["num_prefill_instances"]) * self.prefill.cards_per_instance
                + int(knobs["num_decode_instances"]) * self.decode.cards_per_instance)


def builtin_dir() -> Path:
    return datafiles.builtin_dir("profiles")


def names() -> list[str]:
    return datafiles.builtin_names("profiles")


load = datafiles.loader("profiles", "profile", Profile, cache_size=32)
