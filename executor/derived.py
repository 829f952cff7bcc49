"""A real target's derived twin prior: what simulator/derive.py needs, read off the target (the side-effecting half).

The model's shape from the model the engine loads (a Hugging Face directory's config.json, a GGUF file's header, or
the target's `model_config_json` where the weights live on another host); the card from the target's `card` (a kind of
core/cards.yaml, or `cpu`: this machine measured once, executor/cpu_probe.py, with the engine's own thread
count); the topology from the target's hosts and roles; the engine from its `engine`. The derived profile is written
under the runs root (`_priors/`, named by a digest of everything it came from), so the twin's fits, the prediction
cache and `tuneloop sim derive` all read one file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from core.canonical import canon
from core.errors import FieldError
from core.records import write_atomic
from core.cards import card, known
from executor.cpu_probe import probe
from executor.transports.sim import Derived, ModelSpec, RoleShape, Topology, derive

# engine defaults for the server knobs where a goal leaves one out, by (engine, device kind): what the engine does
# (vLLM V1's CPU platform: a 2048-token step budget; on a GPU 8192; llama-server: one slot, a 512-token batch)
ENGINE_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    ("vllm", "cpu"): {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "enable_prefix_caching": False},
    ("vllm", "gpu"): {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "enable_prefix_caching": True},
    ("llamacpp", "cpu"): {"max_num_batched_tokens": 512, "max_num_seqs": 1, "enable_prefix_caching": False},
}
_GGUF_TYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "Q8_0": "int8"}


def model_of(target: Any) -> ModelSpec:
    """The served model's shape: `model_config_json` (a config.json path) where given, else the model path itself."""
    path = Path(str(getattr(target, "model_config_json", None) or target.model or "")).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FieldError("model", f"{str(path)!r} is not a config.json, a model directory or a GGUF file on this "
                                  f"host (give the target a model_config_json: the model's config.json)")
    if path.suffix == ".gguf":
        return gguf_spec(path)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FieldError("model_config_json", f"{str(path)!r} cannot be read as JSON: {e}") from None
    return ModelSpec.from_hf(config, name=Path(str(target.model or path.parent)).name)


def gguf_spec(path: Path) -> ModelSpec:
    """A GGUF file's header as a model shape (the `<arch>.*` keys llama.cpp reads)."""
    from gguf import GGUFReader  # deferred: the llamacpp extra

    r = GGUFReader(str(path))

    def val(key: str) -> Any:
        f = r.get_field(key)
        if f is None:
            return None
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]][0]

    arch = str(val("general.architecture") or "llama")
    tokens = r.get_field("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else val(f"{arch}.vocab_size")
    types = {t.tensor_type.name for t in r.tensors if t.name.endswith("ffn_up.weight")}
    dtype = _GGUF_TYPES.get(next(iter(types), "F32"), "int4")
    heads = int(val(f"{arch}.attention.head_count"))
    cfg = {"hidden_size": val(f"{arch}.embedding_length"), "num_hidden_layers": val(f"{arch}.block_count"),
           "num_attention_heads": heads, "num_key_value_heads": val(f"{arch}.attention.head_count_kv") or heads,
           "intermediate_size": val(f"{arch}.feed_forward_length"), "vocab_size": vocab,
           "tie_word_embeddings": not any(t.name == "output.weight" for t in r.tensors)}
    return ModelSpec.from_hf(cfg, name=path.stem, weight_dtype=dtype)


def topology_of(target: Any) -> Topology:
    if target.pd:
        p, d = target.hosts_for("prefill"), target.hosts_for("decode")
        shape = (lambda hs: RoleShape(instances=len(hs), cards_per_instance=max(1, max(h.cards for h in hs))))
        connector = (target.pd_connector or "").lower()
        transport = "tcp" if "tcp" in connector else ("local" if (target.card or "") == "cpu" else "rdma")
        return Topology(prefill=shape(p), decode=shape(d), transport=transport, graphs=not _eager(target))
    m = target.hosts_for("mixed") or list(target.hosts)
    serving = [h for h in m if set(h.roles) & {"mixed", "prefill", "decode"}] or m
    shape = RoleShape(instances=len(serving), cards_per_instance=max(1, max(h.cards for h in serving)))
    return Topology(prefill=shape, decode=shape, mixed=True, graphs=not _eager(target))


def _eager(target: Any) -> bool:
    return any("--enforce-eager" in args for args in target.extra_args.values())


def threads_of(target: Any) -> int:
    """The threads a CPU engine computes with: OMP_NUM_THREADS (vLLM), llama-server's --threads / -t, else every
    core."""
    for args in target.extra_args.values():
        args = list(args)
        for flag in ("--threads", "-t"):
            if flag in args and args.index(flag) + 1 < len(args):
                return max(1, int(args[args.index(flag) + 1]))
    omp = target.env.get("OMP_NUM_THREADS")
    return max(1, int(omp)) if omp and omp.isdigit() else (os.cpu_count() or 1)


def derive_target(target: Any) -> Derived:
    """The prior derived for a real target (FieldError naming what is missing when it cannot be)."""
    if not getattr(target, "card", None):
        raise FieldError("card", f"the target names no card kind (card: one of {', '.join(known())}), so no prior "
                                 f"can be derived")
    model = model_of(target)
    topo = topology_of(target)
    kv_space = None
    if target.card == "cpu":
        c = probe(threads_of(target))
        space = target.env.get("VLLM_CPU_KVCACHE_SPACE") if target.engine == "vllm" else None
        kv_space = float(space) if space else None
    else:
        c = card(target.card)
    kind = "cpu" if c.kind == "cpu" else "gpu"
    defaults = ENGINE_DEFAULTS.get((target.engine, kind), {})
    return derive(model, c, topo, engine=target.engine, name=f"{target.name}-derived", defaults=defaults,
                  description=f"derived prior for target {target.name}", kv_space_gib=kv_space)


def write_derived(target: Any, root: Path) -> Path:
    """Derive the target's prior and write it under `root`/_priors/ (a file per distinct derivation); its path."""
    d = derive_target(target)
    key = hashlib.sha256(repr(d.profile.model_dump()).encode()).hexdigest()[:12]
    path = Path(root) / "_priors" / f"{target.name}-derived-{key}.yaml"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, yaml.safe_dump(canon(d.profile.model_dump()), sort_keys=False))
    return path
