"""Prefix caching: the keys and values a prompt's first tokens left in the cache, kept so that
a later prompt beginning with the same tokens (a system prompt, a few-shot preamble, the earlier
turns of a conversation) copies them instead of computing them again.

The prompt is cut into blocks of `BLOCK` ids. A block is stored under its ids *and* the block
before it (a trie: `(parent block, ids) -> block`), so a hit is exact: the same ids in the
same places, never a hash that happens to collide. Each block holds its positions' keys and
values of every layer; `lookup` walks a prompt's blocks from the start and returns how many
positions it found and their arrays. Blocks are evicted least recently used first once the
blocks held pass `capacity_bytes`; a block whose child is held stays until the child goes
(a child is younger or was used more recently), so every held block is reachable.

NumPy only; the decode loop's thread is the only caller (no lock).
"""

from collections import OrderedDict

import numpy as np

BLOCK = 16  # ids a block holds (vLLM's default block size)


class PrefixCache:
    """Blocks of key/value rows keyed by the ids before and in them.

    Args:
        capacity_bytes: the most bytes the blocks hold; 0 turns caching off.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or (
            capacity_bytes < 0
        ):  # fmt: skip
            raise ValueError(
                f"`capacity_bytes` must be an integer >= 0. Received: {capacity_bytes!r}"
            )
        self.capacity_bytes = capacity_bytes
        self.bytes = 0
        # (parent id, block ids) -> (block id, arrays); most recently used last
        self.blocks: OrderedDict[tuple[int, tuple[int, ...]], tuple[int, list[np.ndarray]]] = (
            OrderedDict()
        )
        self.children: dict[int, int] = {}  # block id -> blocks held under it
        self.next_id = 1  # 0: the root, before any block
        self.hit_tokens = 0  # positions served from the cache (for metrics)
        self.lookups = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def lookup(self, prompt: list[int], limit: int) -> tuple[int, list[list[np.ndarray]]]:
        """`(positions, blocks)`: the longest run of held blocks that begins `prompt`, at most
        `limit` positions (whole blocks), and each block's arrays (one per cache buffer,
        `(kv_heads, BLOCK, key_dim)`)."""
        self.lookups += 1
        found: list[list[np.ndarray]] = []
        parent = 0
        for start in range(0, limit - BLOCK + 1, BLOCK):
            key = (parent, tuple(prompt[start : start + BLOCK]))
            entry = self.blocks.get(key)
            if entry is None:
                break
            self.blocks.move_to_end(key)
            parent = entry[0]
            found.append(entry[1])
        self.hit_tokens += len(found) * BLOCK
        return len(found) * BLOCK, found

    def store(self, prompt: list[int], length: int, buffers: list[np.ndarray], row: int) -> None:
        """Holds the blocks of `prompt[:length]` (whole blocks only) from cache `buffers`
        (`(rows, kv_heads, max_length, key_dim)` each) at `row`, those not held yet."""
        if not self.enabled:
            return
        parent = 0
        for start in range(0, length - BLOCK + 1, BLOCK):
            key = (parent, tuple(prompt[start : start + BLOCK]))
            entry = self.blocks.get(key)
            if entry is None:
                arrays = [b[row, :, start : start + BLOCK].copy() for b in buffers]
                size = sum(a.nbytes for a in arrays)
                if size > self.capacity_bytes:
                    return
                entry = (self.next_id, arrays)
                self.next_id += 1
                self.blocks[key] = entry
                self.children[parent] = self.children.get(parent, 0) + 1
                self.bytes += size
                self._evict(keep=key)
                if self.bytes > self.capacity_bytes:  # this prompt alone is past the bound
                    self._drop(key)
                    return
            else:
                self.blocks.move_to_end(key)
            parent = entry[0]

    def _evict(self, keep: tuple[int, tuple[int, ...]]) -> None:
        """Drops least recently used leaf blocks until the held bytes fit."""
        while self.bytes > self.capacity_bytes:
            for key, (block, _) in self.blocks.items():
                if key != keep and not self.children.get(block):
                    break
            else:
                return  # only the block being stored and its parents: they stay
            self._drop(key)

    def _drop(self, key: tuple[int, tuple[int, ...]]) -> None:
        _, arrays = self.blocks.pop(key)
        self.bytes -= sum(a.nbytes for a in arrays)
        parent = key[0]
        self.children[parent] -= 1
        if not self.children[parent]:
            del self.children[parent]
