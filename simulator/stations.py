"""A measured station as the simulator runs it: the engine's knobs mapped onto the simulator's, and one prediction.

Knobs the simulator models under another name map onto it (llama.cpp's `--parallel` slots are the decode batch
limit, its `--ubatch-size` the prefill token budget, `--cache-prompt` the prefix cache); knobs it does not model (threads, context size) are left
out and named, so a prediction says what it could not take into account.
"""
from __future__ import annotations

from typing import Any

from core.knobs import catalog
from core.metrics import summarize
from core.profiles import Profile
from simulator import engine

EQUIVALENT = {"parallel": "max_num_seqs", "ubatch_size": "max_num_batched_tokens", "cache_prompt": "enable_prefix_caching"}
LOAD_KNOBS = ("concurrency", "request_rate")


def sim_knobs(knobs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the knobs the simulator takes, the names it left out)."""
    cat = catalog()
    out: dict[str, Any] = {}
    left: list[str] = []
    for name, value in knobs.items():
        sim = EQUIVALENT.get(name, name)
        if sim in cat and ("sim" in cat.get(sim).engines or cat.get(sim).cost_class == "hot"):
            out[sim] = value
        else:
            left.append(name)
    return out, sorted(left)


def predict(profile: Profile, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
            arrival: str = "constant", burstiness: float = 1.0) -> dict[str, Any]:
    """The simulated figures of one station: output tok/s (whole window), mean TPOT and TTFT in ms, the cards in use."""
    mapped, left = sim_knobs(knobs)
    run = engine.simulate(profile, scenario, profile.knobs(mapped), n=n, warmup=warmup, seed=seed, arrival=arrival,
                          burstiness=burstiness, observe=False)
    s = summarize(run.records, run.info)
    return {"profile": profile.name, "output_tok_s": s.whole.output_tok_s if s.whole else None,
            "output_tok_s_per_card": s.whole.output_tok_s_per_card if s.whole else None,
            "tpot_mean_ms": s.tpot_ms.mean, "ttft_mean_ms": s.ttft_ms.mean, "cards": run.info.cards, "knobs_used": mapped,
            "knobs_not_modelled": left}
