"""A decode instance: continuous batching in steps; per-request tokens follow from resident steps.

No running request is touched on a step: B, ΣKV and the finish heap are kept incrementally, and a
request's chunk times are the slice of the step-end array over the steps it was resident for.

Speculative decoding: draft position i is accepted with conditional probability α·decay^(i-1) (the profile's
`acceptance` and `acceptance_decay`), so survival P(accepted >= i) falls with i; accepted tokens per position
are counted exactly over finished requests (vLLM's `spec_decode_num_accepted_tokens_per_pos`). MoE: each step
pays the most loaded EP rank (`IF` = max/mean rank load); the per-rank routed-token counts follow the layout's
persistent skew (simulator.experts).
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

import numpy as np

from core.profiles import DecodeCost
from simulator.drafts import TokenDraws
from simulator.experts import rank_shares
from simulator.iterstats import BUCKETS, IterationTokens
from simulator.request import SimRequest

N_BUCKETS = len(BUCKETS)


class DecodeInstance:
    def __init__(self, name: str, cost: DecodeCost, max_num_seqs: int, kv_capacity: int, k: int,
                 alpha: float, layout: str, index_cache_reuse: bool, rng: np.random.Generator,
                 decay: float = 1.0, layout_seed: int = 0):
        self.name = name
        self.cost = cost
        self.max_num_seqs = max_num_seqs
        self.kv_capacity = kv_capacity
        self.k = k
        self.alpha = alpha
        self.decay = decay
        # survival[i-1] = P(draft position i accepted) = Π_{j<=i} α·decay^(j-1)
        self.survival = np.cumprod(alpha * decay ** np.arange(k)) if k else np.zeros(0)
        self._survival = self.survival.tolist()
        if decay == 1.0:
            self.al = (1 - alpha ** (k + 1)) / (1 - alpha) if k else 1.0  # expected tokens per step
        else:
            self.al = 1.0 + float(self.survival.sum())
        self.layout = layout
        self.if_static = cost.skew(layout)
        # persistent share of routed tokens per EP rank under this layout (max/mean = if_static)
        self.rank_share = rank_shares(cost.ep, self.if_static, layout_seed) if cost.ep > 1 else np.ones(1)
        self.routed = 0.0  # routed token-expert assignments (tokens x topk), all ranks
        self.saving = cost.index_cache_reuse_saving if index_cache_reuse else 0.0
        self.rng = rng
        self.draws = TokenDraws(rng, k, alpha, decay, self.survival, self.al)  # tokens per step, per request
        self.waiting: deque[SimRequest] = deque()
        self.inbound = 0  # KV transfers in flight to this instance
        # KV hand-offs received from prefill (PD): prompt tokens, transfers, seconds spent transferring
        self.kv_tokens_in, self.kv_transfers, self.kv_transfer_s = 0, 0, 0.0
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
        self.imbalance_s = 0.0  # step time spent waiting on the most loaded EP rank
        self.draft_s = 0.0  # step time of the draft (MTP) passes
        self.accepted_pos = [0] * k  # finished requests: steps whose position i+1 was accepted
        self.iterations = IterationTokens()  # vllm:iteration_tokens_total: generated tokens per step (expected al)
        self._terms: dict[int, tuple] = {}  # batch size -> its step-time terms (_batch_terms)
        self._sched, self._comm = cost.sched_s, cost.comm_share

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
    def admit(self, t: float) -> list[SimRequest]:
        """Admit waiting requests FCFS while a sequence slot and KV room (prompt + output) are free."""
        out: list[SimRequest] = []
        waiting, max_seqs, cap = self.waiting, self.max_num_seqs, self.kv_capacity
        # fits(waiting[0]), inline
        while waiting and self.batch < max_seqs and self.kv_reserved + waiting[0].n_in + waiting[0].n_out <= cap:
            req = waiting.popleft()
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
            req.tokens, req.accepted = self.draws.draw(rest)
            req.s_end = self.step + len(req.tokens)
            self.batch += 1
            self.sum_n_in += req.n_in
            self.sum_s0 += req.s0
            self._seq += 1
            heapq.heappush(self._finish, (req.s_end, self._seq, req))
        return out

    def _batch_terms(self, b: int) -> tuple:
        """The step-time terms that depend on the batch size alone, computed once per size (why: they were
        recomputed every step, and a step's own work is the kv term): (a', c', IF, the waiting share of a step
        (1 - 1/IF), draft time, generated tokens per step, its iteration-histogram bucket, routed assignments)."""
        c = self.cost
        n_tok = b * (self.k + 1)
        imb = 1.0
        if c.ep > 1 and n_tok:
            imb = self.if_static * (1 + math.sqrt(2 * math.log(c.ep) * c.ep / (n_tok * c.topk)))
        tokens = b * self.al
        terms = (c.a * (1 - self.saving) + c.b * n_tok, c.c * (1 - self.saving), imb, 1.0 - 1.0 / imb,
                 self.k * (c.a_draft + c.b_draft * b), tokens, bisect.bisect_left(BUCKETS, tokens),
                 b * (self.k + 1) * c.topk)
        self._terms[b] = terms
        return terms

    def step_parts(self) -> tuple[float, float, float, float]:
        """(step time, core time, IF, draft time): the step pays the most loaded EP rank (IF = max/mean rank
        load: the layout's persistent skew times the expected max of B·(k+1)·topk routings over EP ranks)."""
        a, c, imb, _, draft = (self._terms.get(self.batch) or self._batch_terms(self.batch))[:5]
        core = (a + c * self.kv_used()) * imb
        return self._sched + core + draft, core, imb, draft

    def step_time(self) -> float:
        return self.step_parts()[0]

    def start_step(self, t: float, noise: float, extra: float = 0.0) -> float | None:
        """Start a step of the running batch (None when it is empty); `extra`: the step's prefill share on a mixed
        engine (simulator.mixed)."""
        if self.batch == 0:
            return None
        return self._steps(t, (noise,), 0, -math.inf, -math.inf, False, extra)[0]

    def next_step(self, t: float, lt: float, le: float, noise: list[float], jit: int, finished: list[SimRequest],
                  hold: bool) -> tuple[float | None, int, int, float]:
        """The step in flight ended at t: complete it (its finished requests go to `finished`), admit the waiting, start
        the next step (the next draw of the shared noise table, `noise[jit & 4095]`, jit counting draws), and run ahead
        (_steps) while nothing else comes between and `hold` (batch mode) has no finished request to hand back first.
        Why one call: the cluster's heap, dispatch and a call per part were most of a decode step's cost. The same
        arithmetic as end_step + admit + start_step, in the same order. Returns (the end of the step now in flight,
        None when the batch emptied; steps run ahead; jit; the last run-ahead step's end)."""
        step = self.step = self.step + 1  # end_step: IterationTokens.observe with the batch's tokens and bucket
        tokens, bucket = (self._terms.get(self.batch) or self._batch_terms(self.batch))[5:7]
        it = self.iterations
        it.count += 1
        it.sum += tokens
        if bucket < N_BUCKETS:
            it.buckets[bucket] += 1
        if self._finish and self._finish[0][0] <= step:
            self._finish_due(step, finished)
        if self.waiting:
            for req in self.admit(t):
                if req.s_end == req.s0:
                    finished.append(req)
        jit += 1
        if self.batch == 0:
            self.busy_until = None
            return None, 0, jit, t
        return self._steps(t, noise, jit, lt, le, not (hold and finished), 0.0)

    def _steps(self, t: float, noise, jit: int, lt: float, le: float, run: bool,
               extra: float) -> tuple[float, int, int, float]:
        """Start a step at t with the draw `noise[jit & 4095]`; then, with `run`, complete it and start the next, again
        and again, while the step in flight ends before `lt`, not after `le`, and finishes no request: what the
        cluster's event loop does one event at a time when no other event comes between (its caller checks that: its
        next event is at `lt` or later), each started step taking the next draw. A step's time: the batch's terms
        looked up, (sched + (a' + c'·KV)·IF + draft + extra) x noise, the same arithmetic as step_parts, in the same
        order. Returns (the end of the step in flight, steps completed, jit, the last completed step's end)."""
        b, step, fin, it = self.batch, self.step, self._finish, self.iterations
        a, c, imb, waiting, draft, tokens, bucket, routed = self._terms.get(b) or self._batch_terms(b)
        sched, comm, al, sum_n_in, sum_s0 = self._sched, self._comm, self.al, self.sum_n_in, self.sum_s0
        busy, sch, imbs, drs, coms, itsum = self.busy_s, self.sched_s, self.imbalance_s, self.draft_s, self.comm_s, \
            it.sum
        append, stop, done, last = self.step_end.append, fin[0][0] if fin else math.inf, -1, t
        while True:
            x = noise[jit & 4095]
            core = (a + c * (sum_n_in + al * (b * step - sum_s0))) * imb
            dt = (sched + core + draft + extra) * x
            t = t + dt
            append(t)
            busy += dt
            s = sched if sched <= dt else dt
            wait = core * x * waiting  # every rank waits for the most loaded one
            drafting = draft * x
            sch += s
            imbs += wait
            drs += drafting
            rest = dt - s - wait - drafting
            coms += (rest if rest > 0.0 else 0.0) * comm  # of the balanced main pass
            done += 1
            if not (run and t < lt and t <= le and step + 1 < stop):
                break
            step += 1  # the step completes, finishing nobody (end_step), and the next starts
            itsum += tokens
            last = t
            jit += 1
        if done:
            it.sum, it.count = itsum, it.count + done
            if bucket < N_BUCKETS:
                it.buckets[bucket] += done
        self.step, self.busy_until = step, t
        self.routed = self.routed + routed  # the first step's, then the run-ahead steps' at once (whole numbers)
        if done:
            self.routed = self.routed + routed * done
        self.busy_s, self.sched_s, self.imbalance_s, self.draft_s, self.comm_s = busy, sch, imbs, drs, coms
        return t, done, jit, last

    def end_step(self, prompt_tokens: int = 0) -> list[SimRequest]:
        """Complete the step in flight (with `prompt_tokens` of prefill chunks on a mixed engine); return requests
        whose last token it carried."""
        step = self.step = self.step + 1
        self.busy_until = None
        if prompt_tokens:
            self.iterations.observe(self.batch * self.al + prompt_tokens)
        else:  # IterationTokens.observe with the batch's tokens and bucket looked up
            terms = self._terms.get(self.batch) or self._batch_terms(self.batch)
            it = self.iterations
            it.count += 1
            it.sum += terms[5]
            bucket = terms[6]
            if bucket < N_BUCKETS:
                it.buckets[bucket] += 1
        fin = self._finish
        done: list[SimRequest] = []
        if fin and fin[0][0] <= step:
            self._finish_due(step, done)
        return done

    def _finish_due(self, step: int, done: list[SimRequest]) -> None:
        """Retire the requests whose last token step `step` carried, appending them to `done`."""
        fin, step_end = self._finish, self.step_end
        while fin and fin[0][0] <= step:
            _, _, req = heapq.heappop(fin)
            req.t_finish = step_end[req.s_end]
            self.batch -= 1
            self.sum_n_in -= req.n_in
            self.sum_s0 -= req.s0
            self.kv_reserved -= req.n_in + req.n_out
            self.done_tokens += req.n_out
            self.done_steps += req.s_end - req.s0
            self.success += 1
            if self.k:
                self.accepted_pos = [x + y for x, y in zip(self.accepted_pos, req.accepted)]
            done.append(req)

    def accepted_per_position(self) -> list[float]:
        """Accepted drafts per position (0-based, as vLLM labels them): exact for finished requests, the
        survival times resident steps for running ones."""
        running = self.batch * self.step - self.sum_s0
        # what (np.asarray(accepted_pos, int64) + running * survival).tolist() gives, element by element: the
        # whole counts converted to doubles, times and plus in the same order (a scrape reads it every second)
        return [a + running * s for a, s in zip(self.accepted_pos, self._survival)]

    def expert_load(self) -> list[float]:
        """Routed token-expert assignments per EP rank so far (an expert-distribution record, per rank)."""
        return (self.routed * self.rank_share).tolist()

    def chunks(self, req: SimRequest) -> tuple[list[float], list[int]]:
        """Chunk times and tokens of a finished request: first token at admission, then one per step."""
        times = self.step_end[req.s0: req.s_end + 1]  # one copy: step s0's end gives way to the admission time
        times[0] = req.t_admit
        tokens = req.tokens.tolist()
        tokens.insert(0, 1)
        return times, tokens
