"""A twin's prior derived from what a deployment is: the model's shape, the card, the engine and the topology.

Where a target has no calibrated profile the twin still needs a prior to predict its first run and to fit from
(executor/twin.py). `derive` writes one, by roofline: a step's fixed cost is the weights a device reads, the per-layer
launch and collective latencies; its per-token cost is the FLOPs a token multiplies at a share of the device's peak
plus its collective bytes; a resident KV token costs its bytes read (or its attention FLOPs, whichever is longer).
Every share of a peak it assumes is a named constant below, and every coefficient comes with its uncertainty (a
factor: the prior is right to within ×factor at one standard deviation, a guess for the efficiency it assumed).
The fit to the goal's own runs then replaces what the runs separate (simulator.calibrate), as for any prior.

Formulas (per instance; D devices in a decode instance, dp data-parallel ranks, tp = D / dp tensor-parallel ranks,
E = the experts' split (ep, else tp); a prefill rank has r = P / dp_P devices; bw = memory bandwidth × MEM_EFF):

    decode  a = (dense_bytes / tp + routed_bytes / E) / bw + layers·LAYER_S + 2·layers·link_latency [tp > 1]
                + 2·moe_layers·A2A_LATENCY_S [ep > 1]
            b = 2·active_params / (D · peak · GEMM_EFF) + TP all-reduce and EP all-to-all bytes per token
            c = max(kv_bytes_per_token / (dp · kv_split · bw), decode_pair_flops / (D · peak · ATTN_EFF))
            a_draft = draft_bytes / tp / bw + DRAFT_STEP_S;  b_draft = 2·draft_active / (D · peak · GEMM_EFF)
    prefill a = weights_per_device / bw + layers·LAYER_S + the same latencies (the linear shape's intercept: a
            pass reads its weights once, which its GEMMs hide only at large chunks, where a is small beside b·n)
            b = 2·active / (r · peak · GEMM_EFF)
                + all-reduce bytes;  c = prefill_pair_flops / (r · peak · ATTN_EFF)
    KV      kv_tokens_at_full_memory = (D · memory · (1 − RESERVED) − weights) / (kv_bytes_per_token · replicas)
    hand-off kv_bytes_per_token over min(P, D) devices' NICs × TRANSFER_EFF (TCP: TCP_GB_S), TRANSFER_LATENCY_S

kv_split = min(tp, kv_heads) for grouped-query attention (a head's KV lives on one rank); MLA's compressed KV is
replicated on every tensor-parallel rank (kv_split 1). A mixed engine (prefill chunks and decodes in one step) pays
the decode step plus, for a chunk, one more pass of attention launches (prefill a = layers·LAYER_S) and its tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import FieldError
from core.knobs import catalog
from core.cards import Card, card
from core.profiles import Deployment, Profile
from simulator.model_spec import ACT_BYTES, DISPATCH_BYTES, INDEX_KEY_BYTES, ModelSpec

GiB = float(1 << 30)

# -- the hidden assumptions: shares of a peak, latencies and overheads (each a guess the runs correct) ------------
MEM_EFF = 0.75  # share of peak memory bandwidth a decode step's weight and KV reads reach (GEMV kernels: 70-85 %)
GEMM_EFF = 0.5  # share of dense peak a step's GEMMs reach per token (serving MFU: 40-60 %)
ATTN_EFF = 0.5  # share of peak an attention kernel reaches (FlashAttention-2 on A100: 50-70 %)
CPU_GEMM_EFF = 0.7  # on a CPU the peak is the measured GEMM rate itself: a model's matrices are smaller
RESERVED = 0.08  # of device memory neither weights nor KV (activations, graphs, the allocator's slack)
LAYER_S = {"graphs": 5e-6, "eager": 3e-5, "cpu": 2e-4}  # launch overhead per layer per pass
A2A_LATENCY_S = 5e-5  # one EP dispatch or combine (DeepEP low-latency kernels: tens of µs)
DRAFT_STEP_S = {"graphs": 5e-4, "eager": 1e-3, "cpu": 1e-3}  # a draft pass's own launch and sampling
SCHED_S = {"vllm": 1e-3, "vllm-ascend": 1.5e-3, "sglang": 1e-3, "mindie": 1.5e-3, "llamacpp": 2e-4, "sim": 1e-3}
CPU_SCHED_S = 5e-4  # a CPU engine schedules the same work for far fewer, smaller steps
TRANSFER_EFF = 0.5  # share of the NICs a KV hand-off reaches (RDMA through NIXL / Mooncake)
TCP_GB_S = 1.0  # a KV hand-off over TCP (one 10 GbE-class stream)
TRANSFER_LATENCY_S = {"rdma": 3e-3, "tcp": 2e-2, "local": 1e-3}
LOAD_GB_S = 1.0  # weights read from storage per device per second at a (re)start
RESTART_S = {"gpu": 60.0, "npu": 120.0, "cpu": 5.0}  # an engine's start before its weights load
WARMUP_S = {"gpu": 20.0, "npu": 40.0, "cpu": 2.0}
RELAYOUT_S = 900.0  # an expert re-layout: collect statistics, fit a map, reload
ACCEPTANCE = {"copy": 0.9, "code": 0.8, "chat": 0.7}  # MTP / draft acceptance by task (published ranges)
ACCEPTANCE_DECAY = 0.9
INDEX_CACHE_SAVING = 0.1  # DSA: share of a decode step's fixed and KV time a reused index saves
# how far off each coefficient may be, as a factor at one standard deviation
UNCERTAINTY = {"decode.a": 1.5, "decode.b": 2.0, "decode.c": 1.7, "decode.a_draft": 2.5, "decode.b_draft": 3.0,
               "prefill.a": 2.0, "prefill.b": 1.7, "prefill.c": 2.0, "kv_tokens": 1.3,
               "transfer": 2.0}


class RoleShape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    instances: int = Field(1, ge=1)
    cards_per_instance: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)


class Topology(BaseModel):
    """How the deployment is laid out: per role its instances, cards each and DP ranks; the decode EP size; the KV
    transport between the roles; and whether one engine prefills and decodes in the same steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prefill: RoleShape = RoleShape()
    decode: RoleShape = RoleShape()
    mixed: bool = False
    ep: int = Field(1, ge=1)  # decode expert-parallel ranks (1: experts split like the rest, by TP)
    transport: Literal["rdma", "tcp", "local"] = "rdma"
    graphs: bool = True  # decode steps replayed from captured graphs (CUDA / ACL graphs); False: eager


@dataclass(frozen=True)
class Row:
    """One derived figure: its name in the profile, value, uncertainty factor and the arithmetic behind it."""

    name: str
    value: float
    factor: float | None
    how: str


@dataclass(frozen=True)
class Derived:
    profile: Profile
    rows: tuple[Row, ...]
    model: ModelSpec
    card: Card
    topology: Topology
    engine: str

    def origin(self) -> str:
        """A line for a card or a report: where the prior came from."""
        m = self.model
        size = f"{m.total_params() / 1e9:.3g} B" if m.total_params() >= 1e8 else f"{m.total_params() / 1e6:.3g} M"
        return (f"derived by roofline from {m.name} ({size} parameters, {m.weight_dtype}) on {self.card.name} "
                f"with {self.engine}")


def _compute_dtype(model: ModelSpec, c: Card) -> str:
    return model.weight_dtype if model.weight_dtype in c.tflops else ("fp32" if c.kind == "cpu" else "bf16")


def _mode(c: Card, topo: Topology) -> str:
    return "cpu" if c.kind == "cpu" else ("graphs" if topo.graphs else "eager")


def derive(model: ModelSpec, c: Card, topo: Topology, engine: str = "vllm", name: str | None = None,
           defaults: dict[str, Any] | None = None, start_knobs: dict[str, Any] | None = None,
           description: str = "", kv_space_gib: float | None = None) -> Derived:
    """The prior: a Profile with every coefficient derived, and the table of how. Pure: the same inputs give the
    same profile. `kv_space_gib`: the KV memory an engine is given outright (vLLM on a CPU: VLLM_CPU_KVCACHE_SPACE)
    instead of a share of device memory."""
    mode = _mode(c, topo)
    cpu = c.kind == "cpu"
    dtype = _compute_dtype(model, c)
    peak = c.peak(dtype)
    attn_peak = c.peak("fp32" if cpu else "bf16")
    gemm = CPU_GEMM_EFF if cpu else GEMM_EFF
    attn_eff = CPU_GEMM_EFF if cpu else ATTN_EFF
    bw = c.mem_bw_gb_s * 1e9 * MEM_EFF
    wb = model.weight_bytes
    dense_b, routed_b = model.dense_params() * wb, model.routed_params() * wb
    rows: list[Row] = []

    def row(key: str, value: float, how: str, factor_key: str | None = None) -> float:
        rows.append(Row(key, value, UNCERTAINTY.get(factor_key or key), how))
        return value

    # decode instance
    dd = topo.decode.cards_per_instance * c.devices_per_card
    dp = min(topo.decode.dp, dd)
    tp = max(1, dd // dp)
    ep = topo.ep if model.experts else 1
    split = ep if ep > 1 else tp
    w_dev = dense_b / tp + routed_b / split
    per_layer = LAYER_S[mode] * model.layers
    tp_lat = 2 * model.layers * c.link_latency_us * 1e-6 if tp > 1 else 0.0
    net = c.link_gb_s if ep <= 8 * c.devices_per_card else c.nic_gb_s  # an EP group past one node crosses NICs
    ep_lat = 2 * model.moe_layers * A2A_LATENCY_S if ep > 1 else 0.0
    a_d = row("decode.a", w_dev / bw + per_layer + tp_lat + ep_lat,
              f"{w_dev / 1e9:.3g} GB weights per device / {bw / 1e9:.0f} GB/s + {model.layers} layers x "
              f"{LAYER_S[mode] * 1e6:.0f} us" + (f" + TP latency {tp_lat * 1e3:.2f} ms" if tp_lat else "")
              + (f" + EP latency {ep_lat * 1e3:.2f} ms" if ep_lat else ""))
    ar_tok = 2 * model.layers * model.hidden * ACT_BYTES * 2 * (tp - 1) / tp / (c.link_gb_s * 1e9) / dp if tp > 1 \
        else 0.0
    a2a_tok = (model.moe_layers * model.topk * model.hidden * (DISPATCH_BYTES + ACT_BYTES) / (net * 1e9) / dd
               if ep > 1 else 0.0)
    flops_tok = 2.0 * model.active_params()
    b_d = row("decode.b", flops_tok / (dd * peak * gemm) + ar_tok + a2a_tok,
              f"{flops_tok / 1e9:.3g} GFLOP per token / ({dd} x {peak / 1e12:.4g} TFLOP/s x {gemm})"
              + (" + all-reduce" if ar_tok else "") + (" + all-to-all" if a2a_tok else ""))
    kv_tok = model.kv_bytes_per_token()
    kv_split = 1 if model.mla else min(tp, model.kv_heads)
    read_tok = (model.layers * INDEX_KEY_BYTES) if model.index_topk else kv_tok
    c_mem = read_tok / (dp * kv_split) / bw
    c_flop = (0.0 if model.index_topk else model.decode_pair_flops()) / (dd * attn_peak * attn_eff)
    c_d = row("decode.c", max(c_mem, c_flop),
              f"max({read_tok:.4g} B per KV token / ({dp} DP x {kv_split} KV shards) / bw, "
              f"{model.decode_pair_flops():.3g} FLOP per pair / {dd} devices at {attn_eff} of peak)")
    d_every, d_routed, d_active = model.draft_params()
    a_dr = row("decode.a_draft", (d_every * wb / tp + d_routed * wb / split) / bw + DRAFT_STEP_S[mode],
               f"draft layer + lm_head {(d_every + d_routed) * wb / 1e9:.3g} GB / bw + {DRAFT_STEP_S[mode] * 1e3:.1f} ms "
               f"per pass")
    b_dr = row("decode.b_draft", 2.0 * d_active / (dd * peak * gemm),
               f"{2 * d_active / 1e9:.3g} GFLOP per draft token / {dd} devices")
    rep = tp if model.mla else max(1, tp // kv_split)  # KV replicas within a DP rank
    mem = c.memory_gib * GiB
    weights_frac = min(0.95, w_dev / mem)
    if kv_space_gib is not None:
        kv_full = kv_space_gib * GiB / kv_tok / 0.9  # handed outright: what gmu 0.9 would give (cluster.py)
        weights_frac = 0.0
        kv_how = f"{kv_space_gib:g} GiB given to the KV cache / {kv_tok:.4g} B per token"
    else:
        kv_full = max(1.0, (dd * mem * (1 - RESERVED) - w_dev * dd)) / (kv_tok * rep)
        kv_how = (f"({dd} x {c.memory_gib:g} GiB x {1 - RESERVED:g} - weights) / ({kv_tok:.4g} B per token x {rep} "
                  f"replicas)")
    kv_full = row("decode.kv_tokens_at_full_memory", float(int(kv_full)), kv_how, "kv_tokens")
    sched = CPU_SCHED_S if cpu else SCHED_S.get(engine, SCHED_S["vllm"])

    # prefill rank (a mixed engine: its chunk's share of the decode step)
    if topo.mixed:
        chunk = LAYER_S["cpu" if cpu else "eager"]  # a chunk's attention runs outside the decode step's graphs
        a_p = row("prefill.a", chunk * model.layers, f"a chunk's extra attention pass: {model.layers} layers x "
                                                     f"{chunk * 1e6:.0f} us")
        r, pd_dev, p_tp = dd, dd, tp
    else:
        pd_dev = topo.prefill.cards_per_instance * c.devices_per_card
        r = max(1, pd_dev // min(topo.prefill.dp, pd_dev))
        p_tp = r
        p_w = dense_b / p_tp + (routed_b / pd_dev if model.experts else 0.0)
        p_lat = 2 * model.layers * c.link_latency_us * 1e-6 if p_tp > 1 else 0.0
        launch = LAYER_S["eager" if mode == "graphs" else mode]  # prefill passes are not graph-captured
        a_p = row("prefill.a", p_w / bw + launch * model.layers + p_lat
                  + (2 * model.moe_layers * A2A_LATENCY_S if model.experts and pd_dev > 1 else 0.0),
                  f"{p_w / 1e9:.3g} GB weights per device / {bw / 1e9:.0f} GB/s + {model.layers} layers x "
                  f"{launch * 1e6:.0f} us + collective latency")
    p_ar = 2 * model.layers * model.hidden * ACT_BYTES * 2 * (p_tp - 1) / p_tp / (c.link_gb_s * 1e9) if p_tp > 1 \
        else 0.0
    b_p = row("prefill.b", flops_tok / (r * peak * gemm) + p_ar,
              f"{flops_tok / 1e9:.3g} GFLOP per token / ({r} x {peak / 1e12:.4g} TFLOP/s x {gemm})"
              + (" + all-reduce" if p_ar else ""))
    pair = model.prefill_pair_flops()
    c_p = row("prefill.c", pair / (r * attn_peak * attn_eff),
              f"{pair:.4g} FLOP per (token, context token) / ({r} x {attn_peak / 1e12:.4g} TFLOP/s x {attn_eff})")
    p_mem = (pd_dev * mem * (1 - RESERVED) - (dense_b / p_tp + routed_b / max(1, pd_dev)) * pd_dev) \
        if not topo.mixed else 0.0
    prefix_tokens = int(max(0.0, p_mem * 0.9) / (kv_tok * (tp if model.mla else 1))) if kv_space_gib is None else 0

    # the hand-off
    links = min(topo.prefill.cards_per_instance, topo.decode.cards_per_instance) * c.devices_per_card
    if topo.mixed:
        bw_t, lat_t = 1000.0, 0.0
    elif topo.transport == "tcp":
        bw_t, lat_t = TCP_GB_S, TRANSFER_LATENCY_S["tcp"]
    elif topo.transport == "local" or cpu:
        bw_t, lat_t = c.mem_bw_gb_s * TRANSFER_EFF, TRANSFER_LATENCY_S["local"]
    else:
        bw_t, lat_t = links * c.nic_gb_s * TRANSFER_EFF, TRANSFER_LATENCY_S["rdma"]
    if not topo.mixed:
        row("transfer.bandwidth_gb_s", bw_t, f"rdma: {links} device NICs x {c.nic_gb_s:g} GB/s x {TRANSFER_EFF}"
            if topo.transport == "rdma" and not cpu else f"{topo.transport}: {bw_t:.3g} GB/s", "transfer")
    comm_d = (tp_lat + ep_lat + 64 * (ar_tok + a2a_tok)) / max(1e-12, a_d + 64 * b_d)  # at a batch of 64
    comm_p = (p_ar * 4096) / max(1e-12, a_p + 4096 * b_p)
    moe_skew = {"none": 1.15, "static_eplb": 1.05} if ep > 1 else {"none": 1.0, "static_eplb": 1.0}
    kind = "cpu" if cpu else c.kind
    w_total_dev = max(w_dev, dense_b / max(1, p_tp))
    data = {
        "name": name or f"{model.name}-{c.name}-derived".replace("/", "-"),
        "description": description or f"derived prior: {model.name} on {c.name}, {engine}",
        "default_task": "chat", "mixed": topo.mixed,
        "prefill": topo.decode.model_dump() | {"dp": 1} if topo.mixed else topo.prefill.model_dump(),
        "decode": topo.decode.model_dump(),
        "defaults": dict(defaults or {}), "start_knobs": dict(start_knobs or {}),
        "prefill_cost": {"a": a_p, "b": b_p, "c": c_p, "sched_s": sched * (1 if topo.mixed or cpu else 2),
                         "comm_share": round(min(1.0, comm_p), 4), "prefix_cache_tokens": prefix_tokens},
        "decode_cost": {"a": a_d, "b": b_d, "c": c_d, "a_draft": a_dr, "b_draft": b_dr, "sched_s": sched,
                        "comm_share": round(min(1.0, comm_d), 4), "ep": ep, "topk": model.topk if ep > 1 else 1,
                        "if_static": moe_skew,
                        "index_cache_reuse_saving": INDEX_CACHE_SAVING if model.index_topk else 0.0,
                        "kv_tokens_at_full_memory": int(kv_full), "weights_memory_fraction": round(weights_frac, 4)},
        "transfer": {"latency_s": lat_t, "kv_bytes_per_token": 0.0 if topo.mixed else kv_tok,
                     "bandwidth_gb_s": bw_t, "overlap": 0.0 if topo.transport == "tcp" else 0.5,
                     "serial": topo.transport == "tcp"},
        "acceptance": dict(ACCEPTANCE), "acceptance_decay": ACCEPTANCE_DECAY,
        "costs": {"restart_s": RESTART_S[kind], "weight_load_s": round(w_total_dev / 1e9 / LOAD_GB_S, 1),
                  "warmup_s": WARMUP_S[kind], "relayout_s": RELAYOUT_S if ep > 1 else 0.0},
        "quality": {"baseline": 0.8, "tolerance": 0.005, "index_cache_reuse_drop": 0.01, "noise": 0.0},
        "noise_run_sigma": 0.0 if cpu else 0.012, "noise_step_sigma": 0.0 if cpu else 0.01,
        "derived": {"origin": "", "model": model.name, "card": c.name, "engine": engine, "compute": dtype,
                    "rows": [[x.name, x.value, x.factor, x.how] for x in rows]},
    }
    cat = catalog()
    data["defaults"] = {k: v for k, v in (cat.defaults("sim") | data["defaults"]).items()
                        if k in _SIM_DEFAULT_KNOBS}
    out = Derived(Profile.model_validate(data), tuple(rows), model, c, topo, engine)
    data["derived"]["origin"] = out.origin()
    return Derived(Profile.model_validate(data), tuple(rows), model, c, topo, engine)


# the server knobs a profile's `defaults` names (core/profiles/*.yaml): what the engine does when a goal omits one
_SIM_DEFAULT_KNOBS = ("max_num_batched_tokens", "max_prefill_reqs", "long_prefill_token_threshold", "max_num_seqs",
                      "gpu_memory_utilization", "enable_prefix_caching", "speculative_method",
                      "num_speculative_tokens", "index_cache_reuse", "expert_layout")


def spec_of(desc: Deployment) -> ModelSpec:
    return ModelSpec.from_hf(desc.model, weight_dtype=desc.weight_dtype, kv_dtype=desc.kv_dtype)


def derive_for_profile(prof: Profile) -> Derived:
    """The prior derived from a library profile's own description and topology (its coefficients unread): what
    the bench's derived-prior mode starts each case from, and `tuneloop sim derive --profile`."""
    desc = prof.deployment
    if desc is None:
        raise FieldError("deployment", f"profile {prof.name!r} does not say what its deployment is (model, card)")
    topo = Topology(prefill=RoleShape(**prof.prefill.model_dump()), decode=RoleShape(**prof.decode.model_dump()),
                    mixed=prof.mixed, ep=prof.decode_cost.ep, transport=desc.transport, graphs=desc.graphs)
    return derive(spec_of(desc), card(desc.card), topo, engine=desc.engine, name=f"{prof.name}-derived",
                  defaults=dict(prof.defaults), start_knobs=dict(prof.start_knobs),
                  description=f"derived prior for {prof.name}: {prof.description}")


def error_table(derived: Profile, truth: Profile) -> list[tuple[str, float, float, float]]:
    """(coefficient, derived, truth, derived / truth) for every step cost both give a non-zero value."""
    out = []
    for role in ("prefill", "decode"):
        d, t = getattr(derived, f"{role}_cost"), getattr(truth, f"{role}_cost")
        keys = ("a", "b", "c") + (("a_draft", "b_draft") if role == "decode" else ())
        for k in keys:
            dv, tv = float(getattr(d, k)), float(getattr(t, k))
            if dv > 0 and tv > 0:
                out.append((f"{role}.{k}", dv, tv, dv / tv))
    dk, tk = derived.decode_cost.kv_tokens_at_full_memory, truth.decode_cost.kv_tokens_at_full_memory
    out.append(("decode.kv_tokens_at_full_memory", float(dk), float(tk), dk / tk))
    return out


def within(ratio: float, factor: float = 2.0) -> bool:
    return 1.0 / factor <= ratio <= factor and math.isfinite(ratio)
