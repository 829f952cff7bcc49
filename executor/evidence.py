"""Engine evidence: the digest the planner reasons over, from the Prometheus scrapes of a load.

The scraper (executor/scrape.py) polls every engine instance about once a second and appends EngineSamples to
metrics.jsonl, one series per instance. Queues are summed over a role's instances per scrape round (a PD
deployment has several P and D instances; the planner reads the role's queue), then averaged over time; counters
and KV hand-offs are summed over instances; and each instance is also digested apart, with the spread over a
role's instances (executor/evidence_instances.py). The digest answers the planner's questions: is the prefill
queue persistently non-empty, is decode at its batch limit, what is the spec acceptance, are prefill batches
mostly tails? The names each engine exports are its adapter's (executor/engines/); missing evidence is None,
never 0.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from core import records as rec
from core.evidence import Evidence
from core.knobs import BATCH_CAP, PREFILL_TOKEN_BUDGET, by_role
from core.records import EngineSample, PrefillBatch, RequestRecord, RunInfo
from executor.engines import metric_names
from core.evidence_decode import expert_load, expert_load_spread, spec_accept_per_position
from executor.evidence_instances import per_instance, spread
from executor.evidence_kv import kv_transfer
from executor.evidence_ranks import group_of, ranks
from executor.promseries import base_value, max_value, series_spec
# the scraper and its parsing live in executor/scrape.py; named here too, where the load generator and tests find them
from executor.scrape import instance_name, parse_endpoints, parse_prometheus, scrape_loop

__all__ = ["digest", "digest_run", "first_measured_send", "instance_name", "parse_endpoints", "parse_prometheus",
           "role_series", "scrape_loop"]

# metric names per evidence key come from the engine adapters (executor/engines/<engine>.py `metrics`)
RUNNING = metric_names("running")
WAITING = metric_names("waiting")
BUSY_SLOTS = metric_names("busy_slots")  # llama.cpp: requests_processing/deferred map onto RUNNING/WAITING
KV_USAGE = metric_names("kv_usage")
SPEC_DRAFTS = metric_names("spec_drafts")
SPEC_ACCEPTED = metric_names("spec_accepted")
ACCEPT_LENGTH = metric_names("accept_length")
# decode: only requests waiting for capacity (vLLM's reason="capacity"); those waiting for remote KV apart
WAITING_DECODE = metric_names("waiting_capacity") + WAITING
DEFERRED = metric_names("waiting_deferred")  # vLLM reason="deferred"; SGLang decode transfer queue
PREFILL_BOOTSTRAP = metric_names("prefill_bootstrap")  # SGLang PD queues
PREFILL_INFLIGHT = metric_names("prefill_inflight")
DECODE_PREALLOC = metric_names("decode_prealloc")
ITERATION_TOKENS = metric_names("iteration_tokens")  # vLLM histogram: tokens per engine step
def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _rounds(samples: Sequence[EngineSample], role: str) -> list[list[EngineSample]]:
    """The role's samples grouped by scrape round: the round each sample was asked in, where the scraper recorded
    it (executor/scrape.py: endpoints answer concurrently, each at its own time); else (the simulator stamps a round
    with one t, older records) a round closes when an instance shows up again."""
    mine = sorted((s for s in samples if s.role == role or (s.role == "mixed" and role in ("prefill", "decode"))),
                  key=lambda s: s.t)
    asked = [(s.model_extra or {}).get("round") for s in mine]
    if mine and all(isinstance(r, int) for r in asked):
        by: dict[int, list[EngineSample]] = {}
        for s, r in zip(mine, asked):
            by.setdefault(r, []).append(s)
        return [by[r] for r in sorted(by)]
    rounds: list[list[EngineSample]] = []
    seen: set[str] = set()
    for s in mine:
        if not rounds or s.instance in seen:
            rounds.append([])
            seen = set()
        rounds[-1].append(s)
        seen.add(s.instance)
    return rounds


def role_series(samples: Sequence[EngineSample], role: str, names: Iterable[str]) -> list[tuple[float, float]]:
    """(t, value summed over the role's instances) per scrape round: the queue of the role as a whole.
    A round where no instance reported the metric is left out (missing, not 0)."""
    names = tuple(names)
    out = []
    for rnd in _rounds(samples, role):
        vals = [v for s in rnd if (v := base_value(s.values, names)) is not None]
        if vals:
            out.append((rnd[0].t, float(sum(vals))))
    return out


def _series(samples: Sequence[EngineSample], role: str, names: Iterable[str]) -> list[float]:
    """Per engine and scrape (not summed; the largest of an instance's DP engines): for limits that hold per
    engine, like max_num_seqs."""
    names = tuple(names)
    out = []
    for s in samples:
        if s.role == role or (s.role == "mixed" and role in ("prefill", "decode")):
            v = max_value(s.values, names)
            if v is not None:
                out.append(v)
    return out


def _accept_length(samples: Sequence[EngineSample]) -> float | None:
    direct = [v for s in samples if (v := base_value(s.values, ACCEPT_LENGTH)) is not None and v > 0]
    if direct:
        return _mean(direct)
    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for s in sorted(samples, key=lambda s: s.t):
        d = base_value(s.values, SPEC_DRAFTS)
        a = base_value(s.values, SPEC_ACCEPTED)
        if d is None or a is None:
            continue
        first.setdefault(s.instance, (d, a))
        last[s.instance] = (d, a)
    drafts = sum(last[i][0] - first[i][0] for i in last)
    if drafts <= 0:
        drafts = sum(last[i][0] for i in last)
        acc = sum(last[i][1] for i in last)
    else:
        acc = sum(last[i][1] - first[i][1] for i in last)
    return 1.0 + acc / drafts if drafts > 0 else None


def _iteration_batches(samples: Sequence[EngineSample], budget: float | None) -> dict[str, Any] | None:
    """Prefill-batch evidence of a real vLLM prefill instance from vllm:iteration_tokens_total (tokens per engine
    step, a histogram): its mean over the load and, for the tail share, the steps in buckets up to budget / 8
    (a lower bound: the largest bucket edge at or under it). Only prefill-role samples count (a mixed
    instance's steps are mostly decode)."""
    first: dict[str, dict[str, float]] = {}
    last: dict[str, dict[str, float]] = {}
    for s in sorted((s for s in samples if s.role == "prefill"), key=lambda s: s.t):
        hist = {k: v for k, v in s.values.items() if any(k.startswith(n + "_") for n in ITERATION_TOKENS)}
        if hist:
            first.setdefault(s.instance, hist)
            last[s.instance] = hist

    def delta(suffix: str, le_max: float | None = None) -> float:
        """Increase of one histogram series over the load, summed over instances and their DP engines. With
        le_max: the cumulative bucket with the largest edge at or under it (one bucket per engine)."""
        tot = 0.0
        for inst, now in last.items():
            picked: dict[tuple, tuple[float, str]] = {}
            for k in now:
                base, labels = series_spec(k)
                if not base.endswith(suffix):
                    continue
                if le_max is None:
                    picked[(k,)] = (0.0, k)
                    continue
                le = labels.pop("le", "+Inf")
                if le != "+Inf" and float(le) <= le_max:
                    engine = tuple(sorted(labels.items()))
                    if engine not in picked or float(le) > picked[engine][0]:
                        picked[engine] = (float(le), k)
            for _, k in picked.values():
                tot += now[k] - (first[inst].get(k, 0.0) if first[inst] is not now else 0.0)
        return tot

    count = delta("_count")
    if count <= 0:
        return None
    out: dict[str, Any] = {"tokens_mean": delta("_sum") / count, "count": int(count), "tail": None}
    if budget:
        out["tail"] = delta("_bucket", budget / 8) / count
    return out


def digest(samples: Sequence[EngineSample], batches: Sequence[PrefillBatch], breakdown: dict | None,
           info: RunInfo | None, knobs: dict[str, Any] | None, expert_record: dict | None = None,
           measured_from: Callable[[], float | None] | None = None) -> Evidence:
    """The evidence the planner reads (pinned keys; None where the evidence is missing). `expert_record`: the
    run's expert-load record (core.records.EXPERT_LOAD), when the engine produced one; `measured_from`: when the
    first measured (not warm-up) request was sent, which splits the KV hand-off's failures (asked only of a run
    with hand-off figures)."""
    knobs = knobs or {}
    asked: list[float | None] = []

    def since() -> float | None:  # read once, and only for a run with hand-off figures
        if not asked:
            asked.append(measured_from() if measured_from is not None else None)
        return asked[0]

    load = expert_load(expert_record)
    pw = [v for _, v in role_series(samples, "prefill", WAITING)]
    dw = [v for _, v in role_series(samples, "decode", WAITING_DECODE)]
    dr_total = [v for _, v in role_series(samples, "decode", RUNNING)]
    dr = _series(samples, "decode", RUNNING)
    def kv_max(*roles: str) -> float | None:  # max over DP engines and the roles' instances
        got = [v for s in samples if s.role in roles and (v := max_value(s.values, KV_USAGE)) is not None]
        return max(got) if got else None

    def count(role: str) -> int | None:  # a role's instances (the rank endpoints of one instance count once)
        return len({group_of(s.instance)[0] for r in _rounds(samples, role) for s in r}) or None
    # the limits the digest reads against, by role (any engine's name for them); an engine's raw flag names too,
    # where a run recorded them (SGLang's)
    budget = by_role(knobs, PREFILL_TOKEN_BUDGET) or knobs.get("chunked_prefill_size")
    tail = None
    if batches and budget:
        tail = sum(1 for b in batches if b.n_tokens < budget / 8) / len(batches)
    steps = None if batches else _iteration_batches(samples, budget)

    def queue_mean(role: str, names: tuple[str, ...]) -> float | None:
        return _mean([v for _, v in role_series(samples, role, names)])

    limit = by_role(knobs, BATCH_CAP) or knobs.get("max_running_requests")
    handoff = kv_transfer(samples, since)
    insts = per_instance(samples, limit, since() if handoff is not None else None)

    return Evidence.model_validate({
        # queues: summed over the role's instances at each scrape round, then over time
        "prefill_waiting_mean": _mean(pw),
        "prefill_waiting_nonzero_share": _mean([1.0 if v > 0 else 0.0 for v in pw]),
        "decode_waiting_mean": _mean(dw),
        "decode_waiting_nonzero_share": _mean([1.0 if v > 0 else 0.0 for v in dw]),
        # PD hand-over queues, apart from the capacity queues above (summed over the role's instances)
        "decode_deferred_mean": queue_mean("decode", DEFERRED),  # waiting for remote KV
        "decode_prealloc_mean": queue_mean("decode", DECODE_PREALLOC),  # SGLang: waiting for decode KV room
        "prefill_bootstrap_mean": queue_mean("prefill", PREFILL_BOOTSTRAP),  # SGLang: waiting for the handshake
        "prefill_inflight_mean": queue_mean("prefill", PREFILL_INFLIGHT),  # SGLang: KV being sent
        # running: per engine (the batch limit holds per DP engine) and summed over the role
        "decode_running_mean": _mean(dr),
        "decode_running_max": max(dr) if dr else None,
        "decode_running_total_mean": _mean(dr_total),
        "decode_running_total_max": max(dr_total) if dr_total else None,
        "decode_batch_limit": limit,
        "decode_busy_slots_mean": _mean(_series(samples, "decode", BUSY_SLOTS)),  # llama.cpp: slots per decode step
        "prefill_instances": count("prefill"),
        "decode_instances": count("decode"),
        "kv_usage_max": kv_max("prefill", "decode", "mixed"),  # pooled; the rules read a role's own below
        "decode_kv_usage_max": kv_max("decode", "mixed"),  # a mixed instance holds decode's sequences
        "prefill_kv_usage_max": kv_max("prefill"),
        "spec_accept_length": _accept_length(samples),
        "spec_accept_per_position": spec_accept_per_position(samples),
        "kv_transfer": handoff,  # PD: decode's KV hand-off, summed over instances (executor/evidence_kv.py)
        # every instance's own figures, and the spread over each role's instances (executor/evidence_instances.py)
        "instances": insts,
        "instance_spread": spread(insts),
        "ranks": ranks(samples),  # each DP / EP rank of an instance of several (executor/evidence_ranks.py)
        "expert_load": load,
        "expert_load_spread": expert_load_spread(load),
        "prefill_batch_reqs_mean": _mean([b.n_reqs for b in batches]),
        "prefill_batch_tokens_mean": _mean([b.n_tokens for b in batches]) if batches else (steps or {}).get("tokens_mean"),
        "prefill_tail_batch_share": tail if batches else (steps or {}).get("tail"),
        "prefill_batch_source": "batches" if batches else ("vllm:iteration_tokens_total" if steps else None),
        "breakdown": dict(breakdown or {}),
        "samples": len(samples),
        "n_prefill_batches": len(batches) or (steps or {}).get("count", 0),
        "concurrency": info.concurrency if info else None,
    })


def digest_run(run_dir: Path, info: RunInfo | None = None, knobs: dict[str, Any] | None = None) -> Evidence:
    """digest() over a run directory's files; knobs default to run.json's `knobs` when recorded."""
    samples = list(rec.read_jsonl(run_dir / rec.METRICS, EngineSample))
    batches = list(rec.read_jsonl(run_dir / rec.PREFILL_BATCHES, PrefillBatch))
    bd = run_dir / rec.BREAKDOWN
    breakdown = json.loads(bd.read_text()) if bd.exists() else {}
    el = run_dir / rec.EXPERT_LOAD
    expert_record = json.loads(el.read_text()) if el.exists() else None
    if knobs is None and info is not None:
        knobs = (info.model_extra or {}).get("knobs") or {}
    return digest(samples, batches, breakdown, info, knobs, expert_record, lambda: first_measured_send(run_dir))


def first_measured_send(run_dir: Path) -> float | None:
    """When the run's first measured (not warm-up) request was sent, on the load's clock; None without records."""
    return min((r.t_send for r in rec.read_jsonl(run_dir / rec.REQUESTS, RequestRecord)
                if not r.warmup and r.t_send is not None), default=None)
