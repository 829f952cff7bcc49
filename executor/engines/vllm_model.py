"""A generated Llama in Hugging Face layout for vLLM: config.json + model.safetensors + a local tokenizer.

The same recipe as executor.engines.llamacpp_model's GGUF model (core/scenarios/*.yaml `model:`), written as the directory
`vllm serve DIR` loads with HF_HUB_OFFLINE=1: seeded random float32 weights, and the printable-ASCII byte-level
BPE vocabulary of the GGUF model as a `tokenizers` tokenizer.json. "<s>" and "</s>" are ordinary tokens there
(not special ones), so every token the random model emits decodes to visible text and reaches the client as a
content event (a skipped special token would stream an empty delta). The writer needs torch-free libraries only
(numpy, safetensors, tokenizers); `tuneloop vllm model` runs it with the vLLM venv's python, which has them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from executor.engines.llamacpp_model import ModelRecipe, file_sha256, vocabulary

HF_VERSION = 1  # bump when the writer below changes the bytes it writes for the same recipe
WEIGHTS = "model.safetensors"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def model_key(recipe: ModelRecipe) -> str:
    blob = recipe.model_dump_json(exclude={"sha256"}).encode()
    return f"{recipe.name}-hf{HF_VERSION}-{hashlib.sha256(blob).hexdigest()[:10]}"


def config(recipe: ModelRecipe, vocab_size: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": recipe.n_embd,
            "intermediate_size": recipe.n_ff, "num_hidden_layers": recipe.n_layer,
            "num_attention_heads": recipe.n_head, "num_key_value_heads": recipe.n_head_kv,
            "head_dim": recipe.n_embd // recipe.n_head, "max_position_embeddings": recipe.n_ctx_train,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "vocab_size": vocab_size,
            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "float32",
            "attention_bias": False, "mlp_bias": False}


def tensors(recipe: ModelRecipe, vocab_size: int) -> dict[str, np.ndarray]:
    """HF Llama tensor names, seeded; the same recipe gives the same arrays."""
    rng = np.random.default_rng(recipe.seed)
    e, ff, kv = recipe.n_embd, recipe.n_ff, recipe.kv_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))

    out = {"model.embed_tokens.weight": mat(vocab_size, e)}
    for i in range(recipe.n_layer):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = np.ones(e, dtype=np.float32)
        out[p + "self_attn.q_proj.weight"] = mat(e, e)
        out[p + "self_attn.k_proj.weight"] = mat(kv, e)
        out[p + "self_attn.v_proj.weight"] = mat(kv, e)
        out[p + "self_attn.o_proj.weight"] = mat(e, e)
        out[p + "post_attention_layernorm.weight"] = np.ones(e, dtype=np.float32)
        out[p + "mlp.gate_proj.weight"] = mat(ff, e)
        out[p + "mlp.up_proj.weight"] = mat(ff, e)
        out[p + "mlp.down_proj.weight"] = mat(e, ff)
    out["model.norm.weight"] = np.ones(e, dtype=np.float32)
    out["lm_head.weight"] = mat(vocab_size, e)
    return out


def write_tokenizer(directory: Path) -> int:
    """tokenizer.json (byte-level BPE over the GGUF model's vocabulary) + tokenizer_config.json; returns the
    vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # deferred: tokenizers, in the vLLM venv

    tokens, _, merges = vocabulary()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges],
                     unk_token="<s>")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}, indent=1, sort_keys=True))
    return len(tokens)


def write_model(recipe: ModelRecipe, directory: Path) -> Path:
    """Write the model directory for `recipe` (atomically: a complete directory or none)."""
    from safetensors.numpy import save_file  # deferred: safetensors, in the vLLM venv

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        n_vocab = write_tokenizer(tmp)
        (tmp / "config.json").write_text(json.dumps(config(recipe, n_vocab), indent=1, sort_keys=True))
        (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
        save_file(tensors(recipe, n_vocab), str(tmp / WEIGHTS), metadata={"format": "pt", "recipe": model_key(recipe)})
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def ensure_model(recipe: ModelRecipe, root: Path) -> tuple[Path, str]:
    """The model directory for `recipe` under `root` (written once, then reused) and its weights' sha256."""
    directory = root / model_key(recipe)
    if not (directory / WEIGHTS).is_file():
        write_model(recipe, directory)
    return directory, file_sha256(directory / WEIGHTS)
