"""Exact-output guard for the simulator: every figure a simulated run produces, pinned as a digest.

Why: the simulator's speed work (issue 43 item 4) must not move a single simulated figure. Each case runs
`engine.simulate` (or drives a streaming Cluster as `tuneloop sim serve` does) and hashes everything the run leaves
behind: every request record (chunk times and tokens, TTFT, cached tokens, finish reason), the engine samples,
the prefill batches, the time breakdown, the ground truth and the expert-load record. Floats enter as JSON (their
shortest repr, which round-trips exactly), so any change in any bit fails the case. The digests were computed with
the simulator as it stood before the optimisation (main 9c0a4ca); a deliberate change of the model re-pins them.
Re-pinned when the prefill batch log gained each chunk's context (`PrefillBatch.ctx`): the digests with that field
left out were the old ones in every case, so no figure moved. The cases `dsv4-sim-speed-640` (bench/sim_speed.py's
default run) and `three-decode-gamma` (three decode instances, gamma arrivals) were added with issue 55's speed work,
their digests computed with the simulator as it stood before it (main 5a0ae1c).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from core import profiles
from core.metrics import summarize
from core.records import EngineSample, PrefillBatch, RequestRecord
from simulator import engine
from simulator.cluster import Cluster
from simulator.construct import construct
from simulator.drafts import TokenDraws
from simulator.faults import Faults
from simulator.prefix_cache import BLOCK, PrefixCache, spec_block_hashes, spec_blocks

# name: (profile, scenario, knob overrides on the profile's start station, n, warm-up, seed, arrival, faults)
CASES = {
    "dsv4-mtp3-eplb": ("dsv4-flash-910c-p8d8", "copy16k-zero-cache", {"max_prefill_reqs": 2}, 96, 0, 0,
                       "constant", []),
    "dsv4-plain-poisson": ("dsv4-flash-910c-p8d8", "chat2k", {"speculative_method": "none", "num_speculative_tokens": 0, "expert_layout": "none",
                           "index_cache_reuse": True, "request_rate": 6.0}, 80, 2, 3, "poisson", []),
    "mixed-qwen": ("qwen25-7b-a100-mixed", "chat2k", {}, 120, 0, 1, "constant", []),
    "mixed-prefix": ("qwen25-7b-a100-mixed", "chat2k-out512-agent", {}, 100, 4, 11, "constant", []),
    "mixed-cpu-warm": ("vllm-cpu-mixed-sim", "vllm-chat", {}, 60, 3, 7, "gamma", []),
    "prefix-decay": ("deepseek-v3-h200-p8d8", "copy128k-prefix90", {}, 40, 8, 2, "constant", []),
    "serial-link": ("llama31-70b-h100-p8d4-tcp", "docqa16k-out512", {}, 80, 0, 4, "constant", []),
    "faults": ("llama31-8b-l40s-p1d1", "chat2k-out512-agent", {}, 100, 2, 5, "poisson",
               ["truncate=0.3", "cache_miss=0.2"]),
    "crash": ("llama31-8b-l40s-p1d1", "chat1k-out512", {"request_rate": 1.0}, 60, 0, 6, "constant", ["crash_at=0.5"]),
    "agent-mixed-prefix": ("qwen3-32b-910b-p2d4-agent", "agent12k-tools-out256", {}, 60, 4, 10, "constant", []),
    "mtp-decay-dp": ("deepseek-v3-910c-p4d8", "code4k", {"speculative_method": "mtp", "num_speculative_tokens": 3}, 80, 0, 8, "constant", []),
    "dsv4-sim-speed-640": ("dsv4-flash-910c-p8d8", "copy16k-zero-cache", {"max_prefill_reqs": 2}, 640, 0, 1, "constant",
                           []),
    "three-decode-gamma": ("deepseek-v3-h200-p8d8", "chat2k-out1k", {"num_decode_instances": 3}, 300, 2, 2, "gamma", []),
}

PINNED = {
    "agent-mixed-prefix": "00010717503cdb94c6ab17fddef75883531e1efb2f1b918d99e67d03ce9b91d3",
    "crash": "a5aa11bc88e297ad642c557bd4df348b670d8574ea8528dac8f900c79ea459e3",
    "dsv4-mtp3-eplb": "121e0501ba76ab67147d3b63ead0abb21f0e32b524137dcc1a1dccd9db01e669",
    "dsv4-plain-poisson": "3a33972f179362b7e7e012a4b78b582fdf443433267e3f9b16f74582753ea999",
    "dsv4-sim-speed-640": "5fceaa46c19c7bacd3d26b037cb84f8f4d81f38b543090111e3ad0ea3a4fde4a",
    "faults": "d61bc78190a6209e71a2f7a8ac37958a77feec2e8bac3f2d964600e6636b9e0e",
    "mixed-cpu-warm": "edfeb26c84b4dd71c4756a1c642355ee8a68d93b91939162d1c22ef79a2ecfe4",
    "mixed-prefix": "9231fa948646e53ba0cac9d5c0f7abb98c6af7f060c3172a3402cecec7ed7f19",
    "mixed-qwen": "afb0e0197f072b97e9c047d59729bcd7acd700b843a5ef57b9b469ba70758220",
    "mtp-decay-dp": "d4919c243f3f889f3ecfb73517d962aa5760a8f0d027cc0d82fc8c3c53d682dd",
    "prefix-decay": "109978b9585cc6fb86a7d9a065c00dfe1a2c75b3e5c6fa0169945584a4dd7816",
    "serial-link": "bf76f952d7986a94ca7869cdf8447a2677d71a08c67deeaa5f8be70adc04b570",
    "three-decode-gamma": "5c4f1639c91e8b210825d9829df22070f6ef10eba35f1558735959250fcadba7",
}

SUMMARY_PINNED = {
    "agent-mixed-prefix": "7a7addced447f85bce417c36fe8c97f459917cf112076326fd8ea12cc7f6ae74",
    "crash": "a7336fcb02f948ee1c2f8cc0d611b681a744d120a1c6cf7479cb44b50de2f33b",
    "dsv4-mtp3-eplb": "d1dd9483bbc718558682fd793658a261a9b0919279d0cd3ac75c08b72d874830",
    "dsv4-plain-poisson": "8bf0887f8d6e5870b85187feb0e85a63af558bfe6bd63f16e74736cf9a8339c3",
    "dsv4-sim-speed-640": "c30eebed5efbd1fa60a99661e1773d20261889fa397ae1a4f6177162bdbf01a7",
    "faults": "6083ef005b762f26181067f547e73506dfb5956f48a7dbebeff5eb61c8a2964b",
    "mixed-cpu-warm": "611f228792aa3d9c7febd014844ec49764d0ac93e4c899d9d4aefdc0db0a1e8a",
    "mixed-prefix": "94321f1d3418180dd527f48b053e85b2fe61cfe26b696c0908a2fc09cfc26a30",
    "mixed-qwen": "073a39e6b4e9d38cf90444dcfe1471fa68a61db8d948a1ea5c40346e6ed5c81c",
    "mtp-decay-dp": "fe3f9bde469d594574580ba6dbc71bb8958b831c3b1a049576d4c2121d9f26ca",
    "prefix-decay": "aa29a99c85a75f0ecbd3969af0632a9800b0ddd3a8d7f5845f310944ae2638f4",
    "serial-link": "182ec405b5e4e2061a5d345431a7e475676b87bdfbcc1fc00cbae1644470dad7",
    "three-decode-gamma": "db69374fe5bc2f5347f8e49e959197f1846fe8db81122d245fad1030ec92b605",
}

STREAM_PINNED = "015a9dda9037d1867fdc7ea59eb4b206325f0bfd55ede547dbcac8f5392bb245"


def digest_run(run: engine.SimRun) -> str:
    """sha256 over everything a simulated run leaves behind (the run directory's content, as text)."""
    h = hashlib.sha256()
    for rows in (run.records, run.samples, run.batches):
        for r in rows:
            h.update(r.model_dump_json().encode())
        h.update(b"|")
    for part in (run.breakdown, run.truth, run.expert_load, run.rc):
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()


def run_case(name: str) -> engine.SimRun:
    prof_name, scen, knobs, n, warmup, seed, arrival, faults = CASES[name]
    prof = profiles.load(prof_name)
    return engine.simulate(prof, scen, prof.knobs(knobs, start=True), n=n, warmup=warmup, seed=seed,
                           arrival=arrival, faults=Faults.parse(faults))


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_run_is_bit_identical(name):
    run = run_case(name)
    assert digest_run(run) == PINNED[name], f"{name}: a simulated figure changed"
    # the twin reads a station through core.metrics.summarize: its figures of each run are pinned too
    summary = summarize(run.records, run.info, slos={"ttft_ms": 2000.0, "tpot_ms": 40.0}, native_min_requests=8,
                        native_min_seconds=5.0)
    assert hashlib.sha256(summary.model_dump_json().encode()).hexdigest() == SUMMARY_PINNED[name], name


def stream_digest() -> str:
    """A streaming Cluster (the HTTP server's driver) on the prefix-cache profile: requests arrive while earlier
    ones decode, the clock advances in uneven ticks, and every client-visible event is hashed in order."""
    prof = profiles.load("deepseek-v3-910c-p4d8")
    cl = Cluster(prof, prof.knobs({"speculative_method": "mtp", "num_speculative_tokens": 2}, start=True), seed=9, stream=True)
    h = hashlib.sha256()
    t = 0.0
    for i in range(48):
        n_in = 3000 + 517 * (i % 5)
        cl.submit(i, n_in, 40 + 13 * (i % 7), spec_block_hashes(i, n_in, i % 3, 2048), t)
        t += 0.05 + 0.11 * (i % 4)
        h.update(repr(cl.run_until(t)).encode())
    while cl.next_event_time() is not None:
        t += 0.37
        h.update(repr(cl.run_until(t)).encode())
    h.update(cl.metrics_text().encode())
    return h.hexdigest()


def test_streaming_cluster_is_bit_identical():
    assert stream_digest() == STREAM_PINNED


def reference_draw(rng: np.random.Generator, n: int, k: int, alpha: float, decay: float, survival, al: float):
    """The per-request draw as simulator/decode.py made it before simulator.drafts (9c0a4ca), and its accepted
    drafts per position: the reference the chunked draws must reproduce, uniform for uniform."""
    m = int(n / al * 1.3) + 8
    while True:
        u = rng.random(m)
        if decay == 1.0:
            acc = np.minimum(np.floor(np.log(u) / math.log(alpha)), k).astype(np.int64)
        else:
            acc = (u[:, None] < survival[None, :]).sum(axis=1).astype(np.int64)
        toks = acc + 1
        csum = np.cumsum(toks)
        if csum[-1] >= n:
            last = int(np.searchsorted(csum, n))
            toks = toks[: last + 1].copy()
            toks[-1] -= int(csum[last]) - n
            per = np.bincount(toks - 1, minlength=k + 1)[: k + 1]
            return toks, np.cumsum(per[::-1])[::-1][1:]
        m *= 2


@pytest.mark.parametrize("k,alpha,decay,over", [(3, 0.8, 1.0, 1), (1, 0.6, 1.0, 1), (4, 0.9, 0.85, 1), (2, 0.3, 0.7, 1),
                                                (3, 0.8, 1.0, 4), (2, 0.5, 0.9, 3)])
def test_chunked_draws_are_the_per_request_draws(k, alpha, decay, over):
    """Short outputs to long ones, across chunks; `over` overstates the tokens per step so that the first m uniforms
    fall short and the draw doubles m."""
    survival = np.cumprod(alpha * decay ** np.arange(k))
    al = over * ((1 - alpha ** (k + 1)) / (1 - alpha) if decay == 1.0 else 1.0 + float(survival.sum()))
    ref, new = np.random.default_rng([5, k]), TokenDraws(np.random.default_rng([5, k]), k, alpha, decay, survival, al)
    sizes = [1, 2, 3, 5, 9, 17, 40, 1023, 4000, 70000, 2, 1, 300] * 40
    for n in sizes:
        want, got = reference_draw(ref, n, k, alpha, decay, survival, al), new.draw(n)
        assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]), n


@pytest.mark.parametrize("cls,values", [
    (RequestRecord, dict(id=3, warmup=False, t_sched=0.5, t_send=0.75, chunk_times=[1.0, 1.25], chunk_tokens=[1, 3],
                         n_in=70, n_cached=64, n_out=4, n_out_expected=4, finish_reason="length", http_status=200,
                         ok=True, error=None)),
    (EngineSample, dict(t=2.0, role="decode", instance="d0", values={"a": 1.0})),
    (PrefillBatch, dict(t_start=0.0, t_end=0.125, instance="p0.dp0", n_reqs=2, n_tokens=9, chunks=[4, 5])),
    (RequestRecord, dict(id=1, t_sched=0.0, n_out_expected=2)),  # fields left out: model_construct's own way
])
def test_construct_is_model_construct(cls, values):
    """simulator.construct builds the very object model_construct builds (fields in order, the fields set, extra)."""
    fast, slow = construct(cls, **dict(values)), cls.model_construct(**dict(values))
    assert list(fast.__dict__.items()) == list(slow.__dict__.items()) and fast == slow
    assert fast.model_fields_set == slow.model_fields_set and fast.model_extra == slow.model_extra
    assert fast.model_dump_json() == slow.model_dump_json()


class ReferenceCache:
    """The block-by-block LRU prefix cache as it stood before RequestBlocks (9c0a4ca), for the equivalence test."""

    def __init__(self, capacity_blocks: int):
        self.cap, self.blocks, self.hits = capacity_blocks, OrderedDict(), 0

    def lookup(self, hashes: list[int], n_in: int) -> int:
        n = 0
        for h in hashes[: (n_in - 1) // BLOCK]:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            n += 1
        self.hits += n * BLOCK
        return n * BLOCK

    def insert(self, hashes: list[int]) -> None:
        for h in hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)
            else:
                self.blocks[h] = None
        for _ in range(max(0, len(self.blocks) - self.cap)):
            self.blocks.popitem(last=False)


@pytest.mark.parametrize("capacity", [40, 200, 5000])
def test_request_blocks_cache_is_the_block_by_block_cache(capacity):
    """Random requests of 8 prefix groups (and none), both caches fed the same lookups and inserts: the same hits,
    matches and size after every step, through evictions that cut a request's own run of blocks in two."""
    rng = np.random.default_rng(capacity)
    ref, new, memo = ReferenceCache(capacity), PrefixCache(capacity * BLOCK), {}
    for rid in range(400):
        n_in = int(rng.integers(1, 60)) * BLOCK + int(rng.integers(0, BLOCK))
        group = None if rng.random() < 0.3 else int(rng.integers(0, 8))
        prefix = int(n_in * rng.random()) if group is not None else 0
        full, lazy = spec_block_hashes(rid, n_in, group, prefix), spec_blocks(n_in, group, prefix, memo)
        limit = int(rng.integers(0, 70))
        assert new.match(lazy, limit) == sum(1 for _ in zip(range(limit), iter_present(full, ref.blocks)))
        assert new.lookup(lazy, n_in) == ref.lookup(full, n_in)
        new.insert(lazy)
        ref.insert(full)
        assert (new.hits, new.size) == (ref.hits, len(ref.blocks)), rid


def iter_present(hashes: list[int], blocks: OrderedDict):
    """The leading hashes present in a block map (what match counts)."""
    for h in hashes:
        if h not in blocks:
            return
        yield h
