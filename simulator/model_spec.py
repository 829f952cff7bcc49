"""What a served model is, for a roofline: its shape read from a Hugging Face config.json (or a GGUF header's
metadata, executor/derived.py), and the parameter, byte and FLOP counts a step pays.

One model class for every family the engines serve: dense GQA (Llama, Qwen2/3), MoE (Qwen3-MoE, Mixtral, DeepSeek:
routed experts, top-k, shared experts, leading dense layers) and MLA (DeepSeek: a compressed KV of kv_lora_rank +
the RoPE part per token and layer, replicated over tensor-parallel ranks), with MTP draft layers and a sparse
attention indexer (DeepSeek-V3.2's DSA: each query attends to at most `index_topk` tokens).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import FieldError

DType = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
ACT_BYTES = 2.0  # an activation element on the wire (TP all-reduce, EP combine): bf16
DISPATCH_BYTES = 1.0  # an EP dispatch element (fp8 dispatch, as DeepEP's low-latency kernels send)
INDEX_KEY_BYTES = 128.0  # DSA: the indexer's key per token and layer (128 fp8 values)
INDEX_HEADS, INDEX_HEAD_DIM = 64, 128  # DSA: the lightning indexer's heads and their width (DeepSeek-V3.2)
_TORCH_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


class ModelSpec(BaseModel):
    """The shape of a decoder-only transformer: enough for step-cost rooflines, nothing about its weights' values."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = "model"
    hidden: int = Field(ge=1)
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate: int = Field(ge=1)  # a dense layer's MLP width
    vocab: int = Field(ge=1)
    tied_embeddings: bool = False
    experts: int = Field(0, ge=0)  # routed experts per MoE layer (0: dense)
    topk: int = Field(1, ge=1)
    moe_intermediate: int = Field(0, ge=0)
    shared_experts: int = Field(0, ge=0)
    dense_layers: int = Field(0, ge=0)  # leading dense layers of a MoE model (DeepSeek first_k_dense_replace)
    kv_lora_rank: int = Field(0, ge=0)  # MLA: the compressed KV per token and layer is kv_lora_rank + rope_dim
    q_lora_rank: int = Field(0, ge=0)
    rope_dim: int = Field(0, ge=0)
    nope_dim: int = Field(0, ge=0)
    v_head_dim: int = Field(0, ge=0)
    draft_layers: int = Field(0, ge=0)  # MTP layers shipped with the model (num_nextn_predict_layers)
    index_topk: int = Field(0, ge=0)  # DSA: tokens each query attends to (0: dense attention)
    weight_dtype: DType = "bf16"
    kv_dtype: DType = "bf16"

    # -- parameters ------------------------------------------------------------------------------------------
    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return max(0, self.layers - self.dense_layers) if self.experts else 0

    def attention_params(self) -> int:
        h, n = self.hidden, self.heads
        if self.mla:
            qk = self.nope_dim + self.rope_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * n * qk) if self.q_lora_rank else h * n * qk
            kv = h * (self.kv_lora_rank + self.rope_dim) + self.kv_lora_rank * n * (self.nope_dim + self.v_head_dim)
            return q + kv + n * self.v_head_dim * h
        return 2 * h * n * self.head_dim + 2 * h * self.kv_heads * self.head_dim

    def expert_params(self) -> int:
        """One routed expert (a gated MLP)."""
        return 3 * self.hidden * (self.moe_intermediate or self.intermediate)

    def layer_params(self, moe: bool) -> tuple[int, int]:
        """(parameters read by every token, routed-expert parameters) of one layer."""
        attn = self.attention_params()
        if not moe:
            return attn + 3 * self.hidden * self.intermediate, 0
        shared = self.shared_experts * self.expert_params() + self.hidden * self.experts  # + the router
        return attn + shared, self.experts * self.expert_params()

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def dense_params(self) -> int:
        """Every parameter that is not a routed expert (replicated over data-parallel ranks)."""
        d_dense, _ = self.layer_params(False)
        d_moe, _ = self.layer_params(True)
        return self.embedding_params() + (self.layers - self.moe_layers) * d_dense + self.moe_layers * d_moe

    def routed_params(self) -> int:
        return self.moe_layers * self.layer_params(True)[1]

    def total_params(self) -> int:
        return self.dense_params() + self.routed_params()

    def active_params(self) -> int:
        """Parameters one token's forward pass multiplies (the lm_head included, the embedding lookup not)."""
        routed = self.moe_layers * self.topk * self.expert_params()
        lookup = 0 if self.tied_embeddings else self.vocab * self.hidden  # the input table is read, not multiplied
        return self.dense_params() - lookup + routed

    def draft_params(self) -> tuple[int, int, int]:
        """One draft step's (weights read every step, routed weights, parameters a token multiplies): an MTP layer
        where the model ships one, else one decoder layer as an EAGLE-style head; the lm_head is the model's own."""
        moe = bool(self.experts)
        every, routed = self.layer_params(moe)
        proj = 2 * self.hidden * self.hidden  # the MTP / EAGLE fusion of the hidden state with the next embedding
        head = self.vocab * self.hidden
        active = every + proj + head + (self.topk * self.expert_params() if moe else 0)
        return every + proj + head, routed, active

    # -- bytes and FLOPs ---------------------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> float:
        return BYTES[self.weight_dtype]

    def kv_bytes_per_token(self) -> float:
        """KV bytes one token leaves in the cache (all layers): what a P/D hand-off moves per token."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.rope_dim) * BYTES[self.kv_dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES[self.kv_dtype]

    def prefill_pair_flops(self) -> float:
        """Attention FLOPs per (query token, context token) pair over all layers, as prefill computes it
        (QKᵀ and PV, 2 FLOPs a multiply-add). With a DSA indexer every pair pays the indexer's scores only
        (INDEX_HEADS x INDEX_HEAD_DIM); the attention itself covers index_topk tokens, a per-token cost."""
        if self.index_topk:
            return 2.0 * self.layers * INDEX_HEADS * INDEX_HEAD_DIM
        if self.mla:
            return 2.0 * self.layers * self.heads * (self.nope_dim + self.rope_dim + self.v_head_dim)
        return 4.0 * self.layers * self.heads * self.head_dim

    def decode_pair_flops(self) -> float:
        """The same per (query, resident KV token) in a decode step: MLA attends in the compressed space
        (weights absorbed), so each pair costs heads × (2·(kv_lora_rank + rope) + 2·kv_lora_rank)."""
        if self.mla:
            return 2.0 * self.layers * self.heads * (2 * self.kv_lora_rank + self.rope_dim)
        return 4.0 * self.layers * self.heads * self.head_dim

    # -- reading a config ----------------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: dict[str, Any], name: str | None = None, weight_dtype: str | None = None,
                kv_dtype: str | None = None) -> "ModelSpec":
        """A Hugging Face config.json's keys (Llama, Qwen2/3, Qwen3-MoE, Mixtral, DeepSeek-V2/V3/V3.2 names)."""
        c = dict(config.get("text_config") or config)

        def need(*keys: str) -> int:
            for k in keys:
                if c.get(k) is not None:
                    return int(c[k])
            raise FieldError(f"model.{keys[0]}", "the model's config does not say it")

        hidden, heads = need("hidden_size", "n_embd"), need("num_attention_heads", "n_head")
        experts = int(c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0)
        quant = (c.get("quantization_config") or {})
        q = str(quant.get("quant_method") or "").lower()
        bits = int(quant.get("bits") or quant.get("w_bit") or 0)
        guessed = ("fp8" if q == "fp8" or "fp8" in str(quant.get("fmt", "")).lower()
                   else "int4" if bits == 4 or q in ("awq", "gptq") else "int8" if bits == 8 or q == "w8a8"
                   else _TORCH_DTYPES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), "bf16"))
        wd = weight_dtype or guessed
        return cls(
            name=name or str(c.get("_name_or_path") or c.get("model_type") or "model"),
            hidden=hidden, layers=need("num_hidden_layers", "n_layer"), heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads), intermediate=need("intermediate_size", "n_inner"),
            vocab=need("vocab_size"), tied_embeddings=bool(c.get("tie_word_embeddings", False)),
            experts=experts, topk=int(c.get("num_experts_per_tok") or 1) if experts else 1,
            moe_intermediate=int(c.get("moe_intermediate_size") or 0) if experts else 0,
            shared_experts=int(c.get("n_shared_experts") or (1 if c.get("shared_expert_intermediate_size") else 0)),
            dense_layers=int(c.get("first_k_dense_replace") or 0) if experts else 0,
            kv_lora_rank=int(c.get("kv_lora_rank") or 0), q_lora_rank=int(c.get("q_lora_rank") or 0),
            rope_dim=int(c.get("qk_rope_head_dim") or 0), nope_dim=int(c.get("qk_nope_head_dim") or 0),
            v_head_dim=int(c.get("v_head_dim") or 0), draft_layers=int(c.get("num_nextn_predict_layers") or 0),
            index_topk=int(c.get("index_topk") or 0), weight_dtype=wd,  # type: ignore[arg-type]
            kv_dtype=kv_dtype or ("fp32" if wd == "fp32" else "bf16"))  # type: ignore[arg-type]
