"""Prefix cache on 64-token block hashes with LRU eviction, as vLLM's block pool does it.

A request's block hashes are a list of ints (the HTTP server's chained word hashes), or, for a scenario request in
batch mode, `RequestBlocks`: its prefix group's shared hashes (ints) and a count of blocks only it has. Why: a 16K
prompt is 256 blocks, and hashing, looking up and LRU-moving each one was a third of a batch run's wall time. A
request's own blocks are never matched by another request (ids are unique in a run) nor by itself (its lookup comes
before its insert), so the cache holds them as one LRU entry that counts them, and evicts it from its oldest block on:
the order, the evictions, the hits and the usage are those of the block-by-block cache.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Union

BLOCK = 64


class RequestBlocks:
    """A scenario request's blocks: `shared` (its prefix group's hashes, shared with every request of the group) then
    `own` blocks that no other request has (hash((2, req_id, j)) in spec_block_hashes). Hashable by identity: the
    cache keys the run of own blocks by this object."""

    __slots__ = ("shared", "own")

    def __init__(self, shared: list[int], own: int):
        self.shared = shared
        self.own = own

    def __len__(self) -> int:
        return len(self.shared) + self.own


Blocks = Union[list, RequestBlocks]


class PrefixCache:
    def __init__(self, capacity_tokens: int, enabled: bool = True):
        self.capacity_blocks = capacity_tokens // BLOCK
        self.enabled = enabled and self.capacity_blocks > 0
        self._blocks: OrderedDict[object, int] = OrderedDict()  # key -> blocks it stands for (a hash: 1)
        self.size = 0  # blocks held
        self.queries = 0  # tokens looked up (vllm:prefix_cache_queries_total)
        self.hits = 0  # tokens found (vllm:prefix_cache_hits_total)

    def match(self, hashes: Blocks, limit: int) -> int:
        """Number of leading blocks (of the first `limit`) present, without touching LRU order (for routing)."""
        if not self.enabled:
            return 0
        if type(hashes) is RequestBlocks:
            hashes = hashes.shared  # its own blocks are never present: the match ends where they start
        n = 0
        blocks = self._blocks
        for h in hashes[:limit]:
            if h not in blocks:
                break
            n += 1
        return n

    def lookup(self, hashes: Blocks, n_in: int) -> int:
        """Cached tokens for a request: leading blocks present, leaving at least one token to compute."""
        self.queries += n_in
        if not self.enabled:
            return 0
        if type(hashes) is RequestBlocks:
            hashes = hashes.shared
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

    def insert(self, hashes: Blocks) -> None:
        if not self.enabled:
            return
        blocks = self._blocks
        own = None
        if type(hashes) is RequestBlocks:
            own, hashes = hashes, hashes.shared
        size = self.size
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = 1
                size += 1
        if own is not None and own.own:
            size += own.own - blocks.pop(own, 0)
            blocks[own] = own.own
        over = size - self.capacity_blocks
        while over > 0:  # evict the least recently used blocks, a run of own blocks from its oldest on
            key, n = blocks.popitem(last=False)
            if n > over:
                blocks[key] = n - over
                blocks.move_to_end(key, last=False)
                n = over
            over -= n
            size -= n
        self.size = size

    def clear(self) -> int:
        """Drop every cached block (the hit counters keep counting); returns how many were held."""
        dropped, self.size = self.size, 0
        self._blocks.clear()
        return dropped

    @property
    def usage(self) -> float:
        return self.size / self.capacity_blocks if self.capacity_blocks else 0.0


def spec_block_hashes(req_id: int, n_in: int, prefix_group: int | None, prefix_len: int) -> list[int]:
    """Block hashes of a scenario request: shared-prefix blocks hash by group, the rest by request."""
    n_blocks = n_in // BLOCK
    shared = prefix_len // BLOCK if prefix_group is not None else 0
    return [hash((1, prefix_group, j)) if j < shared else hash((2, req_id, j)) for j in range(n_blocks)]


def spec_blocks(n_in: int, prefix_group: int | None, prefix_len: int,
                shared_memo: dict[tuple[int, int], list[int]]) -> RequestBlocks:
    """spec_block_hashes as RequestBlocks (for a run whose request ids are unique): the group's shared hashes come
    from `shared_memo` (one list per group and length, computed once) and the request's own blocks are counted."""
    n_blocks = n_in // BLOCK
    shared = min(n_blocks, prefix_len // BLOCK) if prefix_group is not None else 0
    key = (prefix_group, shared)
    hashes = shared_memo.get(key)
    if hashes is None:
        hashes = shared_memo[key] = [hash((1, prefix_group, j)) for j in range(shared)]
    return RequestBlocks(hashes, n_blocks - shared)


def block_hashes(words: list[str]) -> list[int]:
    """Chained hash per full 64-word block of a prompt's text: equal prefixes give equal leading hashes (the HTTP
    server's requests, a dataset's prompts)."""
    out, h = [], 0
    for j in range(len(words) // BLOCK):
        h = hash((h, tuple(words[j * BLOCK:(j + 1) * BLOCK])))
        out.append(h)
    return out


def trace_block_hashes(req_id: int, n_in: int, blocks: tuple[int, ...], block_tokens: int) -> list[int]:
    """Block hashes of a trace request whose prompt starts with the trace's blocks (`block_tokens` tokens per id, the
    last one possibly cut short): a block inside trace block b at position s hashes by (b's id, s), so requests that
    share leading ids share those blocks; the rest hash by request."""
    per = block_tokens // BLOCK
    return [hash((3, blocks[j // per], j % per)) if j // per < len(blocks) else hash((2, req_id, j))
            for j in range(n_in // BLOCK)]
