"""Batch mode: a benchmark client (N requests, cap C, rate r, warm-up first) against a Cluster.

`simulate` returns a SimRun with the same raw files a real load run leaves behind, plus the
simulator's own ground truth; `write_run_dir` lays them out per core.records.
"""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core import records as rec
from core import scenarios as sc
from core.errors import FieldError
from core.profiles import Profile
from core.records import EngineSample, PrefillBatch, RequestRecord, RunInfo
from core.traffic import MOONCAKE_BLOCK
from simulator import experts
from simulator import truth as truth_mod
from simulator.cluster import Cluster
from simulator.construct import construct
from simulator.faults import STATS_FAILURE_MARKER, Faults, SimHealthError
from simulator.prefix_cache import block_hashes, spec_block_hashes, spec_blocks, trace_block_hashes


@dataclass
class SimRun:
    info: RunInfo
    records: list[RequestRecord]
    samples: list[EngineSample]
    batches: list[PrefillBatch]
    breakdown: dict[str, Any]
    truth: dict[str, Any]
    cards: int
    expert_load: dict[str, Any] = field(default_factory=dict)  # simulator.experts.record (empty: dense model)
    knobs: dict[str, Any] = field(default_factory=dict)
    rc: int = 0
    faults: Faults = field(default_factory=Faults)


def _record(cluster: Cluster, req, spec: sc.RequestSpec, t_sched: float, t_send: float, warm: bool) -> RequestRecord:
    times, toks = cluster.decode[req.d_inst].chunks(req)
    return construct(
        RequestRecord, id=spec.id, warmup=warm, t_sched=t_sched, t_send=t_send, chunk_times=times, chunk_tokens=toks,
        n_in=req.n_in, n_cached=req.n_cached, n_out=req.n_out, n_out_expected=spec.n_out,
        finish_reason=req.finish_reason, http_status=200, ok=True, error=None)


def tokenized(profile: Profile, specs: list[sc.RequestSpec]) -> list[sc.RequestSpec]:
    """The scenario's requests as the profile's engine tokenises them: fixed + per_word × words prompt tokens (a
    shared prefix scales by per_word alone); unchanged at the simulator's own count (1 and 0). A replay's requests
    carry measured token counts and are not tokenised again."""
    w, f = profile.prompt_tokens_per_word, profile.prompt_tokens_fixed
    if w == 1.0 and f == 0.0:
        return specs
    return [s.model_copy(update={"n_in": max(1, round(f + w * s.n_in)), "prefix_len": round(w * s.prefix_len)})
            for s in specs]


def simulate(profile: Profile, scenario: sc.Scenario | str, knobs: dict[str, Any], n: int, warmup: int = 0,
             seed: int = 0, faults: Faults | None = None, arrival: str = "constant",
             burstiness: float = 1.0, requests: list[sc.RequestSpec] | None = None,
             offsets: list[float] | None = None, on_progress: Callable[[int, float], None] | None = None,
             observe: bool = True) -> SimRun:
    """One load run in virtual time; raises SimLaunchError / SimHealthError before any request.

    `on_progress(done, t)`: called as requests complete (warm-up ones included) with the count so far and the
    virtual seconds since the first send, so a caller can show a long simulated load moving (it throttles).

    A replay (simulator.calibrate_replay) gives the `requests` a measured run sent (its warm-up ones first) instead
    of the scenario's, and the formal ones' scheduled `offsets` from the first (the measured arrival schedule).

    `observe=False`: the run's records alone (a prediction that reads only `records` and `info`: the goal's twin,
    stations.predict, a replay): no per-second scrape samples and no prefill-batch log, which only read the
    cluster's state, so the records come out the same; `samples` and `batches` are then empty."""
    scen = sc.load(scenario) if isinstance(scenario, str) else scenario
    if n < 1:
        raise FieldError("n", f"must be >= 1, got {n}")
    if warmup < 0:
        raise FieldError("warmup", f"must be >= 0, got {warmup}")
    faults = faults or Faults()
    eff = profile.knobs(knobs)
    c = int(eff["concurrency"])
    rate = float(eff["request_rate"])
    cluster = Cluster(profile, knobs, seed=seed, faults=faults, task=scen.task, stream=False)
    cluster.log_batches = observe
    if not cluster.healthy:
        raise SimHealthError("simulated engine never became healthy (fault never_healthy)")
    specs = tokenized(profile, sc.generate(scen, n, warmup)) if requests is None else list(requests)
    if requests is not None and len(specs) != n + warmup:
        raise FieldError("requests", f"{len(specs)} given for n={n} + warmup={warmup}")
    if offsets is not None and len(offsets) != n:
        raise FieldError("offsets", f"{len(offsets)} given for n={n}")
    crash_idx = None if faults.crash_at is None else min(n, int(faults.crash_at * n))
    records: list[RequestRecord] = []
    samples: list[EngineSample] = []
    state = {"next_sample": 0.0, "t": 0.0}
    crashed = False
    # lazy block hashes (simulator.prefix_cache.RequestBlocks) need unique request ids; a replay's are checked
    memo: dict | None = {} if len({s.id for s in specs}) == len(specs) else None

    def run_phase(phase: list[sc.RequestSpec], t_sched: list[float], warm: bool) -> bool:
        """The client's loop over one phase; the clock (`t`) and the next scrape time live in locals while it runs
        (the hot loop) and go back to `state` when it returns."""
        pending = deque(zip(phase, t_sched))
        inflight: dict[int, tuple[sc.RequestSpec, float, float]] = {}
        heap, finished, inf = cluster._heap, cluster.finished, math.inf
        t_now, t_s = state["t"], state["next_sample"]
        formal = not warm
        while pending or inflight:
            t_send = max(pending[0][1], t_now) if pending and len(inflight) < c else inf
            t_ev = heap[0][0] if heap else inf
            if t_send <= t_ev and t_send <= t_s:
                spec, ts = pending.popleft()
                if formal and crash_idx is not None and spec.id - warmup >= crash_idx:
                    state["t"], state["next_sample"] = t_send, t_s
                    return False
                if spec.blocks is not None:  # a trace's prefix blocks
                    hashes = trace_block_hashes(spec.id, spec.n_in, spec.blocks, MOONCAKE_BLOCK)
                elif spec.text is not None:  # a dataset's prompt: what its words share with earlier ones
                    hashes = block_hashes(spec.text.split())
                else:
                    hashes = (spec_block_hashes(spec.id, spec.n_in, spec.prefix_group, spec.prefix_len)
                              if memo is None else spec_blocks(spec.n_in, spec.prefix_group, spec.prefix_len, memo))
                cluster.submit(spec.id, spec.n_in, spec.n_out, hashes, t_send, formal=formal)
                inflight[spec.id] = (spec, ts, t_send)
                t_now = t_send
            elif t_ev <= t_s:
                t_now = cluster.run_batch(t_send, t_s)
                if finished:
                    for req in finished:
                        spec, ts, tsend = inflight.pop(req.id)
                        records.append(_record(cluster, req, spec, ts, tsend, warm))
                    if on_progress is not None:
                        on_progress(len(records), t_now)
                    finished.clear()
            else:
                cluster.advance_to(t_s)
                if observe:
                    samples.extend(cluster.samples(t_s))
                t_s = t_s + 1.0
        state["t"], state["next_sample"] = t_now, t_s
        return True

    if warmup:
        run_phase(specs[:warmup], [0.0] * warmup, True)
    start = state["t"]
    formal = specs[warmup:]
    times = (sc.send_times(scen, n, rate, arrival, burstiness, seed, start) if offsets is None
             else [start + o for o in offsets])
    ok = run_phase(formal, times, False)
    crashed = not ok
    end = state["t"]
    if observe:
        samples.extend(cluster.samples(end))
    info = RunInfo(scenario=scen.name, scenario_version=scen.version, n=n, warmup=warmup, concurrency=c,
                   request_rate=rate, arrival=arrival, burstiness=burstiness, cards=cluster.cards, seed=seed,
                   endpoint=f"sim://{profile.name}", output_len=scen.output_len,
                   profile=profile.name, data_version=scen.data_version,
                   knobs={k: v for k, v in eff.items()}, faults=faults.as_list())
    records.sort(key=lambda r: r.id)
    tr = truth_mod.compute(records, c, cluster.cards)
    tr["crashed"] = crashed
    return SimRun(info=info, records=records, samples=samples, batches=cluster.batches,
                  breakdown=cluster.breakdown(end), truth=tr, cards=cluster.cards, knobs=eff,
                  rc=1 if crashed else 0, faults=faults, expert_load=experts.record(cluster.decode))


def write_run_dir(run: SimRun, run_dir: Path) -> None:
    """All run-dir files of core.records, then rc and the done marker (last)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec.write_atomic(run_dir / rec.RUN_INFO, run.info.model_dump_json(indent=1))
    for name, rows in ((rec.REQUESTS, run.records), (rec.METRICS, run.samples),
                       (rec.PREFILL_BATCHES, run.batches)):
        rec.write_atomic(run_dir / name, "".join(r.model_dump_json() + "\n" for r in rows))
    rec.write_atomic(run_dir / rec.BREAKDOWN, json.dumps(run.breakdown, indent=1))
    rec.write_atomic(run_dir / "truth.json", json.dumps(run.truth, indent=1, default=str))
    if run.expert_load:
        rec.write_atomic(run_dir / rec.EXPERT_LOAD, json.dumps(run.expert_load, indent=1))
    if run.faults.stats_failure:
        rec.write_atomic(run_dir / STATS_FAILURE_MARKER, "injected stats_failure\n")
    rec.mark_done(run_dir, run.rc)
