"""Tokens per decode step under speculative decoding, drawn for many requests at once.

A decode instance draws each admitted request's tokens per step (1 + accepted drafts) from its own random stream:
m uniforms at a time (m = 1.3 × the expected steps + 8, doubled while they fall short) until the request's output
is covered. Why a module: drawing, taking logs and summing per request cost ~15 µs of numpy call overhead each, a
tenth of a batch run. Here the stream is drawn and turned into tokens a chunk at a time (a numpy generator's doubles
come out the same whether drawn in one call or in many), and a request's draw is a slice of the chunk found by
bisection on the chunk's running sum: the same uniforms, the same tokens, the same stream position afterwards.
Each request's accepted drafts per position are counted at its draw, so a finished request adds them at once.
"""
from __future__ import annotations

import math

import numpy as np

CHUNK = 1 << 15  # uniforms drawn at a time


class TokenDraws:
    def __init__(self, rng: np.random.Generator, k: int, alpha: float, decay: float, survival: np.ndarray, al: float):
        self.rng, self.k, self.alpha, self.decay, self.survival, self.al = rng, k, alpha, decay, survival, al
        self.pos = 0  # uniforms of the chunk already consumed
        self.toks = np.zeros(0, dtype=np.int64)  # tokens per step, one per uniform
        self.csum = np.zeros(0, dtype=np.int64)  # running sum of toks

    def _refill(self, need: int) -> None:
        """Keep the unconsumed tail and draw at least `need` more uniforms after it."""
        u = self.rng.random(max(CHUNK, need))
        if self.decay == 1.0:  # geometric: P(acc >= i) = α^i; the same ufuncs on the same doubles, in place
            np.log(u, out=u)
            np.divide(u, math.log(self.alpha), out=u)
            np.floor(u, out=u)
            np.minimum(u, self.k, out=u)
            acc = u.astype(np.int64)
        else:  # acc = the number of positions whose survival exceeds u
            acc = (u[:, None] < self.survival[None, :]).sum(axis=1).astype(np.int64)
        self.toks = np.concatenate([self.toks[self.pos:], acc + 1])
        self.csum = np.cumsum(self.toks)
        self.pos = 0

    def draw(self, n: int) -> tuple[np.ndarray, list[int]]:
        """(tokens per step until n tokens are out, steps that accepted each draft position)."""
        k = self.k
        if k == 0 or self.alpha <= 0.0:
            return np.ones(n, dtype=np.int64), [0] * k
        m = int(n / self.al * 1.3) + 8
        while True:
            if self.pos + m > len(self.toks):
                self._refill(self.pos + m - len(self.toks))
            pos, csum = self.pos, self.csum
            base = int(csum[pos - 1]) if pos else 0
            self.pos = pos + m
            if csum[pos + m - 1] - base >= n:
                last = pos + int(csum[pos:pos + m].searchsorted(base + n))
                toks = self.toks[pos:last + 1].copy()
                toks[-1] -= int(csum[last]) - base - n
                per = np.bincount(toks, minlength=k + 2).tolist()  # steps of v tokens
                accepted, run = [0] * k, 0
                for i in range(k, 0, -1):  # position i - 1 is accepted in steps of at least i + 1 tokens
                    run += per[i + 1]
                    accepted[i - 1] = run
                return toks, accepted
            m *= 2
