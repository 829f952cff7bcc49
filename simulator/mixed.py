"""A mixed engine: one process that prefills and decodes in the same steps (vLLM without disaggregation, chunked
prefill), as a prefill instance's queue and a decode instance's batch stepped together.

vLLM v1's scheduler fills a step with the running requests' decode tokens first, then with chunks of waiting
prompts (FCFS) in the token budget they left (max_num_batched_tokens − B·(k+1)), while sequence slots are free
(a request holds one of max_num_seqs from its first chunk). The step is one forward pass, so its time is the
decode step's plus the chunks' share: t = t_D(B, KV) + [a chunk in it]·a_P + b_P·Σn + c_P·Σn(ctx + n/2); a step
with no decode batch still pays the forward pass's fixed cost (sched_D + a_D). A request's last chunk yields its
first token at the step's end, and it decodes from the next step on. vLLM's iteration_tokens_total observes the
step's generated plus prompt tokens.
"""
from __future__ import annotations

from simulator.decode import DecodeInstance
from simulator.prefill import PrefillInstance
from simulator.request import SimRequest


class MixedEngine:
    def __init__(self, prefill: PrefillInstance, decode: DecodeInstance):
        self.p, self.d = prefill, decode
        self.busy_until: float | None = None
        self.chunks: list[tuple[SimRequest, int]] = []
        self.solo = False  # the step in flight has no decode batch (prefill chunks only)

    def prefilling(self) -> int:
        """Requests that hold a sequence slot with prompt tokens still to compute."""
        return sum(1 for r in self.p.queues[0] if r.looked_up and r.remaining < r.n_in - r.n_cached)

    def start_step(self, t: float, noise: float) -> tuple[float | None, list[SimRequest]]:
        """(the step's end, or None when idle; requests admitted that finished at once: one output token)."""
        p, d = self.p, self.d
        done = [r for r in d.admit(t) if r.s_end == r.s0]
        room = d.max_num_seqs - d.batch - len(d.waiting)
        budget = p.budget - d.batch * (d.k + 1)
        self.chunks = p._form(p.queues[0], budget, room) if room > 0 and budget > 0 and p.queues[0] else []
        c = p.cost
        extra = (c.a + c.b * sum(n for _, n in self.chunks)
                 + c.c * sum(n * (r.ctx + n / 2) for r, n in self.chunks)) if self.chunks else 0.0
        self.solo = d.batch == 0
        if self.solo and not self.chunks:
            return None, done
        if self.solo:
            dt = (d.cost.sched_s + d.cost.a + extra) * noise
            d.busy_s += dt
            d.sched_s += min(d.cost.sched_s, dt)
            self.busy_until = t + dt
        else:
            self.busy_until = d.start_step(t, noise, extra)
        p.current = [self.chunks]
        p.step_start = t
        return self.busy_until, done

    def end_step(self, t: float) -> list[SimRequest]:
        """Complete the step: returns the requests whose last output token it carried; requests whose prompt it
        finished get their first token at t and join the decode batch."""
        p, d = self.p, self.d
        prompt = sum(n for _, n in self.chunks)
        finished: list[SimRequest] = []
        if self.solo:
            d.iterations.observe(prompt)
        else:
            finished = d.end_step(prompt)
        prefilled, _ = p.end_step() if self.chunks else ([], [])
        for req in prefilled:
            req.t_prefill_end = req.t_ready = t
            d.waiting.append(req)
        finished += [r for r in d.admit(t) if r.s_end == r.s0]
        self.chunks = []
        self.busy_until = None
        return finished
