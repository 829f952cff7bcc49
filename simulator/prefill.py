"""A prefill instance: DP ranks in lockstep, chunked prefill with a token budget and a request cap."""
from __future__ import annotations

from collections import deque

from core.profiles import PrefillCost
from simulator.iterstats import IterationTokens
from simulator.prefix_cache import PrefixCache
from simulator.request import SimRequest


class PrefillInstance:
    imbalance_s = 0.0  # the prefill step model has no EP imbalance or draft term (breakdown keys shared with decode)
    draft_s = 0.0

    def __init__(self, name: str, dp: int, cost: PrefillCost, budget: int, cap: int | None,
                 long_threshold: int, cache: PrefixCache):
        self.name = name
        self.cost = cost
        self.budget = budget
        self.cap = cap
        self.long_threshold = long_threshold
        self.cache = cache
        self.queues: list[deque[SimRequest]] = [deque() for _ in range(dp)]
        self.rank_names = [f"{name}.dp{r}" for r in range(dp)]  # a prefill batch's instance name, per rank
        self.load = [0] * dp  # uncached tokens queued per rank (dispatch balance)
        self.busy_until: float | None = None
        self.current: list[list[tuple[SimRequest, int]]] = []  # batches of the step in flight
        self.step_start = 0.0
        self.prompt_tokens = 0
        self.iterations = [IterationTokens() for _ in range(dp)]  # per DP rank (vLLM: one engine each)
        self.busy_s = 0.0
        self.sched_s = 0.0
        self.comm_s = 0.0

    def enqueue(self, req: SimRequest, est_uncached: int) -> None:
        load, queues = self.load, self.queues
        rank, key = 0, None  # the least (load, queue length, rank): min() over the ranks, without a key call each
        for r in range(len(queues)):
            k = (load[r], len(queues[r]), r)
            if key is None or k < key:
                rank, key = r, k
        req.rank = rank
        req.remaining = est_uncached
        self.queues[rank].append(req)
        self.load[rank] += est_uncached

    def waiting(self) -> int:
        """Queued requests not in the step in flight: a batch's requests stay in their rank's queue until the step
        ends (end_step removes the finished ones and clears the step), each once, so a count suffices."""
        return sum(map(len, self.queues)) - self.running()

    def running(self) -> int:
        return sum(len(b) for b in self.current)

    def has_work(self) -> bool:
        return any(self.queues)

    def _look_up(self, req: SimRequest) -> None:
        """A request's first time at the head of a batch: its cached prefix decides what is left to compute."""
        req.looked_up = True
        req.n_cached = 0 if req.no_cache else self.cache.lookup(req.hashes, req.n_in)
        if req.no_cache:
            self.cache.queries += req.n_in
        self.load[req.rank] += (req.n_in - req.n_cached) - req.remaining
        req.remaining = req.n_in - req.n_cached
        req.ctx = req.n_cached

    def _form(self, queue: deque[SimRequest], budget: int | None = None,
              cap: int | None = None) -> list[tuple[SimRequest, int]]:
        """vLLM-style: FCFS, each request takes min(remaining, threshold, budget left), up to the cap (a mixed
        engine passes the budget its decode tokens left and the sequence slots still free)."""
        budget = self.budget if budget is None else budget
        cap = self.cap if cap is None else cap if self.cap is None else min(cap, self.cap)
        batch: list[tuple[SimRequest, int]] = []
        for req in queue:
            if budget <= 0 or (cap is not None and len(batch) >= cap):
                break
            if not req.looked_up:
                self._look_up(req)
            take = min(req.remaining, budget)
            if self.long_threshold > 0:
                take = min(take, self.long_threshold)
            batch.append((req, take))
            budget -= take
        return batch

    def rank_time(self, batch: list[tuple[SimRequest, int]]) -> float:
        c = self.cost
        n_sum = 0
        attn = 0.0
        for req, n in batch:
            n_sum += n
            attn += n * (req.ctx + n / 2)
        return c.a + c.b * n_sum + c.c * attn

    def start_step(self, t: float, noise: float) -> float | None:
        """Form every rank's batch; return the step's end time (slowest rank), or None when idle. Each batch's
        rank_time is computed as _form builds it (_form_timed: the same sums in the same order)."""
        batches: list[list[tuple[SimRequest, int]]] = []
        slowest = None
        form = self._form_timed
        for q in self.queues:
            if not q:
                batches.append([])
                continue
            b, x = form(q)
            batches.append(b)
            if b and (slowest is None or x > slowest):  # max(): the first of equals
                slowest = x
        if slowest is None:
            self.current = []
            return None
        dt = slowest * noise
        self.current = batches
        self.step_start = t
        self.busy_until = t + dt
        self.busy_s += dt
        sched = min(self.cost.sched_s, dt)
        self.sched_s += sched
        self.comm_s += (dt - sched) * self.cost.comm_share
        return self.busy_until

    def _form_timed(self, queue: deque[SimRequest]) -> tuple[list[tuple[SimRequest, int]], float]:
        """_form(queue) with the instance's own budget and cap, and rank_time of the batch it forms, summed as the
        batch is formed (a request's ctx is set before its take and not changed after): the hot path of a step."""
        budget, cap, threshold = self.budget, self.cap, self.long_threshold
        batch: list[tuple[SimRequest, int]] = []
        n_sum = 0
        attn = 0.0
        for req in queue:
            if budget <= 0 or (cap is not None and len(batch) >= cap):
                break
            if not req.looked_up:
                self._look_up(req)
            take = req.remaining if req.remaining < budget else budget  # min(): equal values either way
            if threshold > 0 and threshold < take:
                take = threshold
            batch.append((req, take))
            budget -= take
            n_sum += take
            attn += take * (req.ctx + take / 2)
        c = self.cost
        return batch, c.a + c.b * n_sum + c.c * attn

    def end_step(self) -> tuple[list[SimRequest], list[tuple[str, list[int], list[int]]]]:
        """Apply the step: returns requests whose prefill completed and (rank name, chunks, each chunk's context
        when the step began) per batch."""
        done: list[SimRequest] = []
        log: list[tuple[str, list[int], list[int]]] = []
        load, queues, names, iterations, insert = self.load, self.queues, self.rank_names, self.iterations, \
            self.cache.insert
        prompt = 0
        for rank, batch in enumerate(self.current):
            if not batch:
                continue
            q = queues[rank]
            chunks = []
            ctxs = []
            total = 0  # whole token counts: the integer sums come out the same in any order
            for req, n in batch:
                ctxs.append(req.ctx)
                req.remaining -= n
                req.ctx += n
                total += n
                chunks.append(n)
                if req.remaining <= 0:
                    q.remove(req)
                    done.append(req)
                    insert(req.hashes)
            load[rank] -= total
            prompt += total
            log.append((names[rank], chunks, ctxs))
            iterations[rank].observe(total)
        self.prompt_tokens += prompt
        self.current = []
        self.busy_until = None
        return done, log
