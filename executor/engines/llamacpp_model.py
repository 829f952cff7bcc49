"""A generated llama-architecture GGUF model: the reproducible, versioned model step of a llama.cpp scenario.

Model hubs are out of reach, so the engine under test serves a model written here with seeded random
weights and a small byte-level BPE vocabulary of printable ASCII (every token decodes to visible text,
so every streamed token is a content event). The recipe is data; the same recipe always writes the
same bytes, and the file's sha256 is part of the station's data version.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

RECIPE_VERSION = 1  # bump when the writer below changes the bytes it writes for the same recipe


class ModelRecipe(BaseModel):
    """What to write. Defaults give ~4 M parameters: fast on two CPU cores, still batch-sensitive."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field("tiny-llama", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = Field(0, ge=0)
    n_embd: int = Field(256, ge=32, le=4096)
    n_layer: int = Field(4, ge=1, le=64)
    n_head: int = Field(4, ge=1, le=64)
    n_head_kv: int = Field(4, ge=1, le=64)
    n_ff: int = Field(768, ge=32, le=16384)
    n_ctx_train: int = Field(4096, ge=256, le=131072)
    version: int = RECIPE_VERSION
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # pinned: the written file must match

    @property
    def key(self) -> str:
        blob = self.model_dump_json(exclude={"sha256"}).encode()
        return f"{self.name}-v{self.version}-{hashlib.sha256(blob).hexdigest()[:10]}"

    def params(self) -> int:
        vocab = len(vocabulary()[0])
        per_layer = 2 * self.n_embd * self.n_embd + 2 * self.n_embd * self.kv_dim + 3 * self.n_embd * self.n_ff
        return 2 * vocab * self.n_embd + self.n_layer * per_layer

    @property
    def kv_dim(self) -> int:
        return self.n_embd // self.n_head * self.n_head_kv


def _byte_char(b: int) -> str:
    """GPT-2's byte -> unicode mapping for the bytes we use (printable ASCII, space, newline)."""
    if 33 <= b <= 126:
        return chr(b)
    return {32: "\u0120", 10: "\u010a"}[b]


@lru_cache(maxsize=1)
def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 2 control tokens, single bytes, then merges for 'w'-words and digit pairs."""
    tokens = ["<s>", "</s>"]
    types = [3, 3]  # CONTROL
    singles = [_byte_char(b) for b in [10, 32, *range(33, 127)]]
    tokens += singles
    types += [1] * len(singles)  # NORMAL
    merges: list[str] = []

    def merge(a: str, b: str) -> None:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(1)
    merge("\u0120", "w")
    for i in range(10):
        for j in range(10):
            merge(str(i), str(j))
    return tokens, types, merges


def write_model(recipe: ModelRecipe, path: Path) -> Path:
    """Write the GGUF file for `recipe` at `path` (atomically); the same recipe gives the same bytes."""
    import gguf  # deferred: gguf, an optional extra (llama.cpp models)

    tokens, types, merges = vocabulary()
    rng = np.random.default_rng(recipe.seed)
    e, ff, kv = recipe.n_embd, recipe.n_ff, recipe.kv_dim
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(recipe.key)
    w.add_context_length(recipe.n_ctx_train)
    w.add_embedding_length(e)
    w.add_block_count(recipe.n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(recipe.n_head)
    w.add_head_count_kv(recipe.n_head_kv)
    w.add_rope_dimension_count(e // recipe.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(len(tokens), e))
    for i in range(recipe.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(e))
        w.add_tensor(p + "attn_q.weight", mat(e, e))
        w.add_tensor(p + "attn_k.weight", mat(kv, e))
        w.add_tensor(p + "attn_v.weight", mat(kv, e))
        w.add_tensor(p + "attn_output.weight", mat(e, e))
        w.add_tensor(p + "ffn_norm.weight", ones(e))
        w.add_tensor(p + "ffn_gate.weight", mat(ff, e))
        w.add_tensor(p + "ffn_up.weight", mat(ff, e))
        w.add_tensor(p + "ffn_down.weight", mat(e, ff))
    w.add_tensor("output_norm.weight", ones(e))
    w.add_tensor("output.weight", mat(len(tokens), e))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ModelMismatch(RuntimeError):
    """The written model is not the pinned one (another gguf/numpy version?): the data version would lie."""


def ensure_model(recipe: ModelRecipe, directory: Path) -> tuple[Path, str]:
    """The model file for `recipe` under `directory` (written once, then reused) and its sha256.

    With a pinned sha256 the file must match it; a mismatching file is rewritten once, then refused."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{recipe.key}.gguf"
    if not path.exists():
        write_model(recipe, path)
    digest = file_sha256(path)
    if recipe.sha256 and digest != recipe.sha256:
        write_model(recipe, path)
        digest = file_sha256(path)
        if digest != recipe.sha256:
            raise ModelMismatch(f"model.sha256: {recipe.key} wrote {digest}, the scenario pins {recipe.sha256}")
    return path, digest


def scenario_recipe(scenario: object) -> ModelRecipe:
    """The model recipe a scenario names (its `model:` mapping); a clear error when it names none."""
    spec = getattr(scenario, "model", None)
    if not spec:
        raise ValueError(f"scenario {getattr(scenario, 'name', '?')!r}: model: no model recipe (needed for llama.cpp)")
    return ModelRecipe.model_validate(spec)
