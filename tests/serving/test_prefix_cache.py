"""Prefix caching: prompts that begin alike reuse the keys and values of their shared blocks,
with the ids of an uncached run (greedy and sampled), bounded by bytes (least recently used
out), and reported (`usage.prompt_tokens_details.cached_tokens`, `/metrics`)."""

import asyncio

import numpy as np
import pytest
from keras_attn_serving.batched_generation import DecodeBatcher
from keras_attn_serving.prefix_cache import BLOCK, PrefixCache
from keras_attn_serving.sampling import Sampler

from tests.serving.test_batched_generation import predictor  # noqa: F401  (the fixture)

pytestmark = pytest.mark.tf_only


def _buffers(rows, length, fill):
    return [np.full((rows, 2, length, 4), fill + n, np.float32) for n in range(4)]


def test_blocks_are_exact_bounded_and_least_recently_used_first():
    one_block = 4 * 2 * BLOCK * 4 * 4  # 4 buffers of (2 heads, BLOCK, 4) float32
    cache = PrefixCache(3 * one_block)
    a = list(range(100, 140))
    cache.store(a, 40, _buffers(1, 64, 1.0), 0)  # 2 whole blocks of 40 ids
    assert cache.bytes == 2 * one_block
    found, blocks = cache.lookup([*a, 7, 8], 41)
    assert found == 2 * BLOCK and blocks[1][2][0, 0, 0] == 3.0
    assert cache.lookup(a[:20], 19)[0] == BLOCK  # whole blocks within the limit only
    assert cache.lookup(a[:20], 15)[0] == 0
    assert cache.lookup([5, *a[1:]], 40)[0] == 0  # one id differs in block 0: no hit
    b = a[:16] + list(range(200, 216))  # shares block 0, not block 1
    assert cache.lookup(b, 32)[0] == BLOCK
    cache.store(b, 32, _buffers(1, 64, 5.0), 0)
    assert cache.bytes == 3 * one_block  # block 0 held once
    c = list(range(300, 316))
    cache.lookup(b, 32)  # b's blocks are used: a's second block is the oldest leaf
    cache.store(c, 16, _buffers(1, 64, 9.0), 0)
    assert cache.bytes <= 3 * one_block
    assert cache.lookup(a, 40)[0] == BLOCK and cache.lookup(b, 32)[0] == 2 * BLOCK
    assert cache.lookup(c, 16)[0] == BLOCK
    small = PrefixCache(one_block)  # a prompt past the bound keeps what fits, never more
    small.store(a, 40, _buffers(1, 64, 1.0), 0)
    assert small.bytes == one_block and small.lookup(a, 40)[0] == BLOCK
    assert not PrefixCache(0).enabled
    with pytest.raises(ValueError, match="capacity_bytes"):
        PrefixCache(-1)


def test_cached_prefixes_give_the_ids_of_an_uncached_run(predictor):  # noqa: F811
    vocab = predictor.gqa_session.get_outputs()[0].shape[-1]
    rng = np.random.default_rng(1)
    shared = [int(t) for t in rng.integers(1, vocab, size=2 * BLOCK + 1)]
    prompts = [shared + [int(t) for t in rng.integers(1, vocab, size=k)] for k in (1, 3, 0, 2)]
    prompts.append([*shared[: 2 * BLOCK], 5])  # a hit that leaves one id: the step path
    batcher = DecodeBatcher(predictor.gqa_session, predictor.gqa, predictor.pad_token_id,
                            max_decode_rows=4, prefix_cache_bytes=1 << 20)  # fmt: skip

    async def run(prompt, sampler):
        outcome = {}
        ids = [t async for t in batcher.astream(prompt, 3, sampler=sampler, outcome=outcome)]
        return ids, outcome.get("cached_tokens")

    try:
        for i, prompt in enumerate(prompts):
            for sampled in (False, True):
                seed = 7 + i
                make = (lambda s=seed: Sampler("sample", 0.9, seed=s)) if sampled else (
                    lambda: None)  # fmt: skip
                alone = predictor.generate_ids([prompt], 3, sampler=make())[0]
                ids, cached = asyncio.run(run(prompt, make()))
                assert ids == alone, (i, sampled)
                if i or sampled:  # the first prompt filled the cache
                    assert cached == 2 * BLOCK, (i, sampled)
        assert batcher.prefix.hit_tokens >= 9 * 2 * BLOCK
    finally:
        batcher.close()
