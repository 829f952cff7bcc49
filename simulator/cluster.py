"""The simulated PD-disaggregated cluster (or, with a mixed profile, engines that prefill and decode in the same
steps: simulator.mixed): one core, driven in virtual time.

Batch mode (`engine.simulate`) and the HTTP server both drive a Cluster: `submit` requests at a
time, `run_until(t)` to advance, read back first-token / chunk / finish events. Deterministic per seed.
"""
from __future__ import annotations

import heapq
import math
import random
from typing import Any

import numpy as np

from core.profiles import Profile
from core.records import EngineSample, PrefillBatch
from simulator import scrape
from simulator.construct import construct
from simulator.decode import DecodeInstance
from simulator.faults import Faults
from simulator.mixed import MixedEngine
from simulator.prefill import PrefillInstance
from simulator.prefix_cache import PrefixCache, RequestBlocks
from simulator.request import Event, SimRequest


class Cluster:
    def __init__(self, profile: Profile, knobs: dict[str, Any], seed: int = 0, faults: Faults | None = None,
                 task: str | None = None, stream: bool = True):
        self.profile = profile
        self.knobs = profile.knobs(knobs)
        self.seed = seed
        self.faults = faults or Faults()
        self.faults.check_launch()
        self.healthy = not self.faults.never_healthy
        self.task = task or profile.default_task
        self.stream = stream
        k = self.knobs
        self.cards = profile.cards(k)
        rng = np.random.default_rng(seed)
        self._run_factor = float(np.exp(rng.normal(0.0, profile.noise_run_sigma)))
        # what _noise returns, per draw: the run factor times a step's jitter (numpy's products are Python's)
        self._scaled = (self._run_factor * np.exp(rng.normal(0.0, profile.noise_step_sigma, 4096))).tolist()
        self._jit_i = 0
        spec_k = int(k["num_speculative_tokens"]) if k["speculative_method"] != "none" else 0
        gmu = float(k["gpu_memory_utilization"])
        dc = profile.decode_cost
        kv_cap = int(dc.kv_tokens_at_full_memory * max(0.0, gmu - dc.weights_memory_fraction)
                     / (1.0 - dc.weights_memory_fraction))
        self.prefill = [
            PrefillInstance(f"p{i}", profile.prefill.dp, profile.prefill_cost, int(k["max_num_batched_tokens"]),
                            k["max_prefill_reqs"], int(k["long_prefill_token_threshold"]),
                            PrefixCache(profile.prefill_cost.prefix_cache_tokens, bool(k["enable_prefix_caching"])))
            for i in range(int(k["num_decode_instances" if profile.mixed else "num_prefill_instances"]))
        ]
        self.decode = [
            DecodeInstance(f"d{i}", dc, int(k["max_num_seqs"]), kv_cap, spec_k, profile.acceptance[self.task],
                           str(k["expert_layout"]), bool(k["index_cache_reuse"]), np.random.default_rng([seed, i]),
                           decay=profile.acceptance_decay, layout_seed=i)
            for i in range(int(k["num_decode_instances"]))
        ]
        self.mixed = [MixedEngine(p, d) for p, d in zip(self.prefill, self.decode)] if profile.mixed else []
        self._m_pending = [False] * len(self.mixed)
        self.now = 0.0
        self._heap: list[tuple[float, int, str, Any]] = []
        # a decode instance may run ahead to steps ending before _lt and not after _le (run_batch, advance_to)
        self._lt, self._le, self._batch = math.inf, -math.inf, False
        self._seq = 0
        self._p_pending = [False] * len(self.prefill)
        self._d_pending = [False] * len(self.decode)
        self._p_inflight = [0] * len(self.prefill)  # prefilled, KV transfer under way
        self._link_free = [0.0] * len(self.decode)  # transfer.serial: when each decode instance's link frees
        self.requests: dict[int, SimRequest] = {}
        self.finished: list[SimRequest] = []  # drained by batch mode
        self._streaming: dict[int, SimRequest] = {}
        self.batches: list[PrefillBatch] = []
        self.log_batches = True  # False: no PrefillBatch per step (a run read for its records alone)
        self.submitted = 0

    # -- public API -------------------------------------------------------------------------
    def submit(self, req_id: int, n_in: int, n_out: int, block_hashes: list[int], t: float,
               formal: bool = True) -> None:
        """A request arrives at the router at virtual time t (>= the cluster's clock)."""
        if n_in < 1 or n_out < 1:
            raise ValueError(f"request {req_id}: n_in and n_out must be >= 1, got {n_in}, {n_out}")
        t = max(t, self.now)
        f = self.faults
        no_cache, reason = False, "length"
        if formal and (f.cache_miss or f.truncate):  # the draws decide nothing when neither fault is on
            r = random.Random(self.seed * 1_000_003 + req_id)
            u_miss, u_trunc, u_len = r.random(), r.random(), r.random()
            no_cache = u_miss < f.cache_miss
            if u_trunc < f.truncate and n_out > 1:
                n_out = max(1, int(n_out * (0.3 + 0.6 * u_len)))
                reason = "stop"
        req = SimRequest(req_id, n_in, n_out, block_hashes, t, formal, no_cache, reason)
        req.emitted = -1
        self.requests[req_id] = req
        self.submitted += 1
        i = self._route_prefill(req)
        req.p_inst = i
        inst = self.prefill[i]
        match = 0 if no_cache else inst.cache.match(block_hashes, (n_in - 1) // 64)
        inst.enqueue(req, n_in - match * 64)
        if self.mixed:
            req.d_inst = i
            if self.mixed[i].busy_until is None and not self._m_pending[i]:
                self._m_pending[i] = True
                self._push(t, "ms", i)
        elif inst.busy_until is None and not self._p_pending[i]:
            self._p_pending[i] = True
            self._push(t, "ps", i)
        if self.stream:
            self._streaming[req_id] = req

    def next_event_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, t: float) -> list[Event]:
        """Advance the clock to t; return the client-visible events with times <= t, in time order."""
        self.advance_to(t)
        return self._stream_events(t) if self.stream else []

    def advance_to(self, t: float) -> None:
        """Advance without reporting: events stay pending for the next run_until."""
        self._le = t
        if self._heap and self._heap[0][0] <= t:
            self._process(math.inf, t, False)
        self._le = -math.inf
        self.now = max(self.now, t)

    def advance(self) -> float | None:
        """Process every event at the earliest pending time (batch mode); returns that time."""
        if not self._heap:
            return None
        return self._process(math.inf, math.inf, True)

    # -- event loop -------------------------------------------------------------------------
    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _noise(self) -> float:
        self._jit_i += 1
        return self._scaled[self._jit_i & 4095]

    def _process(self, t_send: float, t_sample: float, once: bool) -> float:
        """Process the pending event times in order, each time's events in the order they were queued: the first
        time whatever it is, then each next one while it comes before `t_send` and not after `t_sample`, in batch mode
        while no request has finished, and none when `once`. Returns the last time processed (or the last decode
        step a run-ahead completed). One loop for run_batch, advance_to and advance: no call per event time."""
        heap, pop, batch, finished = self._heap, heapq.heappop, self._batch, self.finished
        while True:
            t0 = heap[0][0]
            while heap and heap[0][0] == t0:
                t, _, kind, x = pop(heap)
                self.now = t
                if kind == "d":
                    self._decode_step(x, t)
                elif kind == "p":
                    self._prefill_end(x, t)
                elif kind == "ps":
                    self._p_pending[x] = False
                    self._prefill_start(x, t)
                elif kind == "x":
                    self._transfer_done(x, t)
                elif kind == "ds":
                    self._d_pending[x] = False
                    self._decode_start(x, t)
                elif kind == "ms":
                    self._m_pending[x] = False
                    self._mixed_start(x, t)
                elif kind == "m":
                    self.finished.extend(self.mixed[x].end_step(t))
                    self._mixed_start(x, t)
            if once or not heap or (batch and finished) or heap[0][0] >= t_send or heap[0][0] > t_sample:
                return self.now

    def run_batch(self, t_send: float, t_sample: float) -> float:
        """Batch mode: process the pending event times that come before `t_send` and not after `t_sample`, up to
        and including the first that finishes a request (the client then has a free slot); returns the last time
        processed. The caller's loop would have taken the same events one time at a time (engine.simulate)."""
        self._lt, self._le, self._batch = t_send, t_sample, True
        t = self._process(t_send, t_sample, False)
        self._lt, self._le, self._batch = math.inf, -math.inf, False
        return t

    def _prefill_start(self, i: int, t: float) -> None:
        inst = self.prefill[i]
        if inst.busy_until is not None:
            return
        self._jit_i += 1
        end = inst.start_step(t, self._scaled[self._jit_i & 4095])
        if end is not None:
            self._push(end, "p", i)

    def _prefill_end(self, i: int, t: float) -> None:
        """A prefill step ended: log its batches, hand each finished prompt's KV to the least loaded decode instance,
        and start the instance's next step (what _prefill_start does: the instance is idle now). The pushes are
        inline, in the order the events were queued before (transfers, then the next step)."""
        inst = self.prefill[i]
        t_start = inst.step_start
        done, log = inst.end_step()
        if self.log_batches:
            for name, chunks, ctxs in log:
                self.batches.append(construct(PrefillBatch, t_start=t_start, t_end=t, instance=name,
                                              n_reqs=len(chunks), n_tokens=sum(chunks), chunks=chunks, ctx=ctxs))
        heap, push, seq = self._heap, heapq.heappush, self._seq
        if done:
            tr = self.profile.transfer
            latency, kv, bw, keep, serial = (tr.latency_s, tr.kv_bytes_per_token, tr.bandwidth_gb_s * 1e9,
                                             1 - tr.overlap, tr.serial)
            decode, link_free = self.decode, self._link_free
            for req in done:
                req.t_prefill_end = t
                j, least = 0, None  # the least loaded decode instance, the first of equals
                for jj, d in enumerate(decode):
                    load = d.batch + len(d.waiting) + d.inbound
                    if least is None or load < least:
                        j, least = jj, load
                req.d_inst = j
                decode[j].inbound += 1
                self._p_inflight[i] += 1
                dt = latency + req.n_in * kv / bw * keep
                seq += 1
                if serial:  # the decode instance's link carries one KV transfer at a time: later ones queue
                    start = max(t, link_free[j])
                    link_free[j] = start + dt - latency
                    push(heap, (start + dt, seq, "x", req))
                else:
                    push(heap, (t + dt, seq, "x", req))
        jit = self._jit_i = self._jit_i + 1
        end = inst.start_step(t, self._scaled[jit & 4095])
        if end is not None:
            seq += 1
            push(heap, (end, seq, "p", i))
        self._seq = seq

    def _transfer_done(self, req: SimRequest, t: float) -> None:
        req.t_ready = t
        self._p_inflight[req.p_inst] -= 1
        d = self.decode[req.d_inst]
        d.inbound -= 1
        d.kv_tokens_in += req.n_in  # the whole prompt's KV arrives, cached on prefill or not
        d.kv_transfers += 1
        d.kv_transfer_s += t - req.t_prefill_end
        d.waiting.append(req)
        if d.busy_until is None and not self._d_pending[req.d_inst]:
            self._d_pending[req.d_inst] = True
            self._push(t, "ds", req.d_inst)

    def _decode_start(self, j: int, t: float) -> None:
        d = self.decode[j]
        if d.busy_until is not None:
            return
        for req in d.admit(t):
            if req.s_end == req.s0:
                self.finished.append(req)
        end = d.start_step(t, self._noise())
        if end is not None:
            self._push(end, "d", j)

    def _decode_step(self, j: int, t: float) -> None:
        """A decode step ended: finish its requests, admit, start the next step, and run ahead while nothing else
        comes between (the hot path: one call per decode step that another event interrupted)."""
        heap = self._heap
        lt = heap[0][0] if heap and heap[0][0] < self._lt else self._lt  # a tie goes to the event already queued
        end, steps, self._jit_i, last = self.decode[j].next_step(t, lt, self._le, self._scaled, self._jit_i,
                                                                 self.finished, self._batch)
        if end is None:
            return
        if steps:  # nothing else happened before the last of these steps ended (and batch mode held no finish back)
            self.now = last
            self._seq += steps  # the events those steps would have queued
        self._seq += 1
        heapq.heappush(heap, (end, self._seq, "d", j))

    def _mixed_start(self, i: int, t: float) -> None:
        m = self.mixed[i]
        if m.busy_until is not None:
            return
        end, done = m.start_step(t, self._noise())
        self.finished.extend(done)
        if end is not None:
            self._push(end, "m", i)

    # -- online streaming -------------------------------------------------------------------
    def _stream_events(self, t: float) -> list[Event]:
        out: list[Event] = []
        gone: list[int] = []
        for rid, req in self._streaming.items():
            if req.t_admit is None or req.t_admit > t:
                continue
            d = self.decode[req.d_inst]
            if req.emitted < 0:
                out.append(Event("first", rid, req.t_admit, 1, n_cached=req.n_cached))
                req.emitted = 0
            steps = len(req.tokens)
            while req.emitted < steps and req.s0 + req.emitted + 1 < len(d.step_end) \
                    and d.step_end[req.s0 + req.emitted + 1] <= t:
                out.append(Event("chunk", rid, d.step_end[req.s0 + req.emitted + 1],
                                 int(req.tokens[req.emitted])))
                req.emitted += 1
            if req.emitted == steps and req.t_finish is not None and req.t_finish <= t:
                out.append(Event("finish", rid, req.t_finish, n_out=req.n_out, finish_reason=req.finish_reason))
                gone.append(rid)
        for rid in gone:
            del self._streaming[rid]
            self.requests.pop(rid, None)
        out.sort(key=lambda e: (e.t, e.req_id, e.kind != "first", e.kind == "finish"))
        return out

    # -- routing ----------------------------------------------------------------------------
    def _route_prefill(self, req: SimRequest) -> int:
        """Cache-aware: the instance holding the longest prefix, then the least queued work."""
        best, key = 0, None
        h = req.hashes  # a scenario request without a shared prefix matches nowhere (its own blocks are its own)
        lookup = not req.no_cache and (type(h) is not RequestBlocks or bool(h.shared))
        for i, inst in enumerate(self.prefill):
            m = inst.cache.match(h, 64) if lookup else 0
            k = (-m, sum(inst.load), i)
            if key is None or k < key:
                best, key = i, k
        return best

    # -- observability (simulator.scrape) ----------------------------------------------------
    def snapshot(self) -> list[tuple[str, str, dict[str, float]]]:
        """(role, instance, Prometheus name -> value) for every instance at the current clock."""
        return scrape.snapshot(self)

    def samples(self, t: float) -> list[EngineSample]:
        return scrape.samples(self, t)

    def metrics_text(self, t: float | None = None) -> str:
        """Prometheus text exposition of snapshot(), labelled by role and instance."""
        if t is not None and t > self.now:
            self.advance_to(t)
        return scrape.metrics_text(self)

    def breakdown(self, elapsed: float) -> dict[str, dict[str, float]]:
        return scrape.breakdown(self, elapsed)
