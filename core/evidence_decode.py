"""Decode-side evidence for the digest: spec-decode acceptance per draft position, expert load per EP rank.

* Acceptance per position: vLLM's `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}` over
  `vllm:spec_decode_num_drafts_total` (llama.cpp exports the same pair under `llamacpp:`): entry i is the share
  of drafts whose position i+1 was accepted (a survival, falling with i). Counters are differenced over the
  run per instance (first to last scrape), summed over instances.
* Expert load: the run directory's expert_load.json (core.records.EXPERT_LOAD: routed token-expert
  assignments per EP rank, per instance, as SGLang's expert-distribution recorder and vLLM's EPLB load window
  count them). Per role: `per_rank` = each rank's share summed over the role's instances, `max_over_mean` =
  the worst instance's max/mean rank load (that rank sets every step of its instance).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from core.records import EngineSample

DRAFTS = ("vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total")
PER_POS = ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "llamacpp:spec_decode_num_accepted_tokens_per_pos_total")
_POSITION = re.compile(r'[{,]\s*position="(\d+)"')


def _positions(values: dict[str, float]) -> dict[int, float] | None:
    for name in PER_POS:
        got: dict[int, float] = {}
        for key, v in values.items():
            if key.startswith(name + "{") and (m := _POSITION.search(key)):
                got[int(m.group(1))] = got.get(int(m.group(1)), 0.0) + v
        if got:
            return got
    return None


def _total(values: dict[str, float], name: str) -> float | None:
    hits = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return float(sum(hits)) if hits else None


def _drafts(values: dict[str, float]) -> float | None:
    for name in DRAFTS:
        if (total := _total(values, name)) is not None:
            return total
    return None


def spec_accept_per_position(samples: Sequence[EngineSample]) -> list[float] | None:
    """[share of drafts whose position i+1 was accepted for i = 0..k-1], or None without the counters."""
    first: dict[str, tuple[float, dict[int, float]]] = {}
    last: dict[str, tuple[float, dict[int, float]]] = {}
    for s in sorted(samples, key=lambda s: s.t):
        d, pos = _drafts(s.values), _positions(s.values)
        if d is None or pos is None:
            continue
        first.setdefault(s.instance, (d, pos))
        last[s.instance] = (d, pos)
    if not last:
        return None
    k = 1 + max(i for _, pos in last.values() for i in pos)
    drafts = sum(last[i][0] - first[i][0] for i in last)
    if drafts > 0:
        acc = [sum(last[i][1].get(p, 0.0) - first[i][1].get(p, 0.0) for i in last) for p in range(k)]
    else:  # one scrape per instance (or counters reset): the totals since start
        drafts = sum(last[i][0] for i in last)
        acc = [sum(last[i][1].get(p, 0.0) for i in last) for p in range(k)]
    if drafts <= 0:
        return None
    return [max(0.0, a) / drafts for a in acc]


def spec_decode_stats(samples: Sequence[EngineSample]) -> dict[str, Any] | None:
    """`vllm bench serve`'s spec-decode figures (vllm/benchmarks/serve.py: counter deltas between its scrapes
    before and after the run) from our first and last scrape of each instance: drafts, draft and accepted tokens,
    acceptance rate (%) and length, acceptance per position. None without vLLM's counters or without drafts."""
    names = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
    first: dict[str, dict] = {}
    last: dict[str, dict] = {}
    for s in sorted(samples, key=lambda s: s.t):
        got = {key: _total(s.values, name) for key, name in names.items()}
        if None in got.values():
            continue
        got["pos"] = _positions(s.values) or {}
        first.setdefault(s.instance, got)
        last[s.instance] = got
    delta = {key: sum(last[i][key] - first[i][key] for i in last) for key in names}
    if delta["draft_tokens"] <= 0:
        return None
    positions = sorted({p for i in last for p in last[i]["pos"]})
    per_pos = [sum(last[i]["pos"].get(p, 0.0) - first[i]["pos"].get(p, 0.0) for i in last) / delta["drafts"]
               for p in positions] if delta["drafts"] > 0 else []
    return {"spec_decode_acceptance_rate": delta["accepted"] / delta["draft_tokens"] * 100,
            "spec_decode_acceptance_length": 1 + delta["accepted"] / delta["drafts"] if delta["drafts"] > 0 else 0.0,
            "spec_decode_num_drafts": int(delta["drafts"]), "spec_decode_draft_tokens": int(delta["draft_tokens"]),
            "spec_decode_accepted_tokens": int(delta["accepted"]),
            "spec_decode_per_position_acceptance_rates": per_pos}


def expert_load(raw: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """{role: {"per_rank": [shares, sum 1], "max_over_mean": float}} from an expert-load record, or None."""
    out: dict[str, dict[str, Any]] = {}
    for role, insts in (raw or {}).items():
        if not isinstance(insts, dict):
            continue
        total: list[float] = []
        worst, worst_at, each = None, None, {}
        for name, rec in insts.items():
            load = [float(x) for x in (rec or {}).get("per_rank_tokens") or []]
            if not load or sum(load) <= 0:
                continue
            if len(total) < len(load):
                total += [0.0] * (len(load) - len(total))
            for r, x in enumerate(load):
                total[r] += x
            mom = each[name] = max(load) / (sum(load) / len(load))
            if worst is None or mom > worst:
                worst, worst_at = mom, name
        if worst is not None:
            s = sum(total)
            out[role] = {"per_rank": [x / s for x in total], "max_over_mean": worst, "worst_instance": worst_at,
                         "per_instance": each}
    return out or None


def expert_load_spread(load: dict[str, dict[str, Any]] | None) -> float | None:
    """Max over roles of max_over_mean (1.0 = perfectly balanced), or None without expert-load evidence."""
    return max(v["max_over_mean"] for v in load.values()) if load else None
