"""A decode instance: continuous batching in steps; per-request tokens follow from resident steps.

No running request is touched on a step: B, ΣKV and the finish heap are kept incrementally, and a
request's chunk times are the slice of the step-end array over the steps it was resident for.
"""
from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from core.profiles import DecodeCost
from simulator.request import SimRequest


class DecodeInstance:
    def __init__(self, name: str, cost: DecodeCost, max_num_seqs: int, kv_capacity: int, k: int,
                 alpha: float, layout: str, index_cache_reuse: bool, rng: np.random.Generator):
        self.name = name
        self.cost = cost
        self.max_num_seqs = max_num_seqs
        self.kv_capacity = kv_capacity
        self.k = k
        self.alpha = alpha
        self.al = (1 - alpha ** (k + 1)) / (1 - alpha) if k else 1.0  # expected tokens per step
        self.if_static = cost.if_static.get(layout, 1.0)
        self.saving = cost.index_cache_reuse_saving if index_cache_reuse else 0.0
        self.rng = rng
        self.waiting: deque[SimRequest] = deque()
        self.inbound = 0  # KV transfers in flight to this instance
        self.step = 0  # completed steps
        self.step_end: list[float] = [0.0]  # step_end[j] = end time of step j (j >= 1)
        self.busy_until: float | None = None
        self.batch = 0
        self.sum_n_in = 0
        self.sum_s0 = 0
        self.kv_reserved = 0
        self._finish: list[tuple[int, int, SimRequest]] = []
        self._seq = 0
        # counters (exact for finished requests; running ones are estimated from resident steps)
        self.done_tokens = 0
        self.done_steps = 0
        self.success = 0
        self.busy_s = 0.0
        self.sched_s = 0.0
        self.comm_s = 0.0

    # -- KV and batch figures ---------------------------------------------------------------
    def kv_used(self) -> float:
        return self.sum_n_in + self.al * (self.batch * self.step - self.sum_s0)

    def kv_usage(self) -> float:
        return min(1.0, self.kv_used() / self.kv_capacity) if self.kv_capacity else 0.0

    def resident_steps(self) -> int:
        return self.done_steps + self.batch * self.step - self.sum_s0

    def generated_tokens(self) -> float:
        return self.done_tokens + self.batch + self.al * (self.batch * self.step - self.sum_s0)

    def fits(self, req: SimRequest) -> bool:
        return self.kv_reserved + req.n_in + req.n_out <= self.kv_capacity

    # -- stepping ---------------------------------------------------------------------------
    def _draw_tokens(self, n: int) -> np.ndarray:
        """Tokens per step (1 + accepted drafts, geometric in α, at most k) until n tokens are out."""
        if self.k == 0 or self.alpha <= 0.0:
            return np.ones(n, dtype=np.int64)
        m = int(n / self.al * 1.3) + 8
        log_a = math.log(self.alpha)
        while True:
            u = self.rng.random(m)
            acc = np.minimum(np.floor(np.log(u) / log_a), self.k).astype(np.int64)
            toks = acc + 1
            csum = np.cumsum(toks)
            if csum[-1] >= n:
                last = int(np.searchsorted(csum, n))
                toks = toks[: last + 1].copy()
                toks[-1] -= int(csum[last]) - n
                return toks
            m *= 2

    def admit(self, t: float) -> list[SimRequest]:
        """Admit waiting requests FCFS while a sequence slot and KV room (prompt + output) are free."""
        out: list[SimRequest] = []
        while self.waiting and self.batch < self.max_num_seqs and self.fits(self.waiting[0]):
            req = self.waiting.popleft()
            req.t_admit = t
            req.s0 = self.step
            rest = req.n_out - 1  # the first token came from prefill
            self.kv_reserved += req.n_in + req.n_out
            out.append(req)
            if rest <= 0:
                req.tokens = np.zeros(0, dtype=np.int64)
                req.s_end = self.step
                req.t_finish = t
                self.kv_reserved -= req.n_in + req.n_out
                self.done_tokens += 1
                self.success += 1
                continue
            req.tokens = self._draw_tokens(rest)
            req.s_end = self.step + len(req.tokens)
            self.batch += 1
            self.sum_n_in += req.n_in
            self.sum_s0 += req.s0
            self._seq += 1
            heapq.heappush(self._finish, (req.s_end, self._seq, req))
        return out

    def step_time(self) -> float:
        c = self.cost
        b = self.batch
        n_tok = b * (self.k + 1)
        imb = 1.0
        if c.ep > 1 and n_tok:
            imb = self.if_static * (1 + math.sqrt(2 * math.log(c.ep) * c.ep / (n_tok * c.topk)))
        core = (c.a * (1 - self.saving) + c.b * n_tok + c.c * (1 - self.saving) * self.kv_used()) * imb
        return c.sched_s + core + self.k * (c.a_draft + c.b_draft * b)

    def start_step(self, t: float, noise: float) -> float | None:
        if self.batch == 0:
            return None
        dt = self.step_time() * noise
        self.step_end.append(t + dt)
        self.busy_until = t + dt
        self.busy_s += dt
        s = min(self.cost.sched_s, dt)
        self.sched_s += s
        self.comm_s += (dt - s) * self.cost.comm_share
        return self.busy_until

    def end_step(self) -> list[SimRequest]:
        """Complete the step in flight; return requests whose last token it carried."""
        self.step += 1
        self.busy_until = None
        done: list[SimRequest] = []
        while self._finish and self._finish[0][0] <= self.step:
            _, _, req = heapq.heappop(self._finish)
            req.t_finish = self.step_end[req.s_end]
            self.batch -= 1
            self.sum_n_in -= req.n_in
            self.sum_s0 -= req.s0
            self.kv_reserved -= req.n_in + req.n_out
            self.done_tokens += req.n_out
            self.done_steps += req.s_end - req.s0
            self.success += 1
            done.append(req)
        return done

    def chunks(self, req: SimRequest) -> tuple[list[float], list[int]]:
        """Chunk times and tokens of a finished request: first token at admission, then one per step."""
        times = [req.t_admit] + self.step_end[req.s0 + 1: req.s_end + 1]
        return times, [1] + req.tokens.tolist()
