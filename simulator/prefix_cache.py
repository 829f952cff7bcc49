"""Prefix cache on 64-token block hashes with LRU eviction, as vLLM's block pool does it."""
from __future__ import annotations

from collections import OrderedDict

BLOCK = 64


class PrefixCache:
    def __init__(self, capacity_tokens: int, enabled: bool = True):
        self.capacity_blocks = capacity_tokens // BLOCK
        self.enabled = enabled and self.capacity_blocks > 0
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # tokens looked up (vllm:prefix_cache_queries_total)
        self.hits = 0  # tokens found (vllm:prefix_cache_hits_total)

    def match(self, hashes: list[int]) -> int:
        """Number of leading blocks present, without touching LRU order (for routing)."""
        if not self.enabled:
            return 0
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def lookup(self, hashes: list[int], n_in: int) -> int:
        """Cached tokens for a request: leading blocks present, leaving at least one token to compute."""
        self.queries += n_in
        if not self.enabled:
            return 0
        usable = (n_in - 1) // BLOCK
        n = 0
        blocks = self._blocks
        for h in hashes[:usable]:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            n += 1
        self.hits += n * BLOCK
        return n * BLOCK

    def insert(self, hashes: list[int]) -> None:
        if not self.enabled:
            return
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        over = len(blocks) - self.capacity_blocks
        for _ in range(max(0, over)):
            blocks.popitem(last=False)

    @property
    def usage(self) -> float:
        return len(self._blocks) / self.capacity_blocks if self.capacity_blocks else 0.0


def spec_block_hashes(req_id: int, n_in: int, prefix_group: int | None, prefix_len: int) -> list[int]:
    """Block hashes of a scenario request: shared-prefix blocks hash by group, the rest by request."""
    n_blocks = n_in // BLOCK
    shared = prefix_len // BLOCK if prefix_group is not None else 0
    return [hash((1, prefix_group, j)) if j < shared else hash((2, req_id, j)) for j in range(n_blocks)]
