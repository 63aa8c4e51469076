"""Iteration-level batching: requests at different lengths share decode steps, and each gets
the ids it would get decoded alone (greedy, sampled with a seed, with stop ids)."""

import threading
import time

import keras
import numpy as np
import pytest
from keras_attn_export import export_model
from keras_attn_serving import Predictor
from keras_attn_serving.batched_generation import DecodeBatcher
from keras_attn_serving.generation import BucketedCache
from keras_attn_serving.sampling import Sampler

from keras_attn.models import CausalLM
from tests.helpers import stream_together

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module", params=["learned", "llama"])
def predictor(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batched") / request.param
    keras.utils.set_random_seed(3)
    if request.param == "llama":  # rotary inside GroupQueryAttention, 4 heads over 2
        from tests.models import llama_reference as ref

        config, weights = ref.random_checkpoint("llama", head_dim=16)
        ref.write_folder(folder.parent / "hf", config, weights)
        lm = CausalLM.from_pretrained(folder.parent / "hf")
    else:
        lm = CausalLM(61, 40, hidden_dim=16, num_layers=2, num_heads=2)
    export_model(lm, folder, formats=["onnx"], verbose=False)
    loaded = Predictor(folder)
    assert loaded.gqa_session is not None
    # Llama reads id 0 as a token: no id is padding, every id can be generated (format 3).
    assert loaded.pad_token_id == (None if request.param == "llama" else 0)
    return loaded


def _requests(vocab, count, seed):
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        prompt = [int(t) for t in rng.integers(1, vocab, size=int(rng.integers(1, 10)))]
        sampled = i % 2 == 1
        requests.append({
            "prompt": prompt,
            "max_new_tokens": int(rng.integers(1, 20)),
            "stop": [],
            "sampler": (lambda s=1000 + i, k=[None, 5][i % 4 == 1]: Sampler(
                "sample", temperature=0.8, top_k=k, seed=s)) if sampled else (lambda: None),
        })  # fmt: skip
    return requests


def test_shared_steps_give_each_request_its_ids_alone(predictor):
    vocab = predictor.gqa_session.get_outputs()[0].shape[-1]
    requests = _requests(vocab, 14, seed=0)
    for r in requests[::3]:  # a stop id the request meets: its third new id decoded alone
        ids = predictor.generate_ids([r["prompt"]], 20, sampler=r["sampler"]())[0]
        r["stop"], r["max_new_tokens"] = [ids[2]], 20
    alone = [
        predictor.generate_ids(
            [r["prompt"]], r["max_new_tokens"], r["stop"], sampler=r["sampler"]()
        )[0]
        for r in requests
    ]
    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=8
    )
    together = stream_together(batcher, [(r["prompt"], r["max_new_tokens"], r["stop"],
                                          r["sampler"]()) for r in requests])  # fmt: skip
    batcher.close()
    assert together == alone
    assert any(len(ids) < r["max_new_tokens"] for ids, r in zip(alone, requests, strict=True))
    # Steps were shared (14 requests, at most 8 rows): more than two rows a step on average.
    assert batcher.rows_stepped > 2 * batcher.steps > 0


def test_a_row_the_runtime_fails_on_fails_alone(predictor, monkeypatch):
    """Ids past the vocabulary that got past the check (forced here) fail their own request
    only, in a prefill run (a long bad prompt) and in a shared step (a bad last id), while 8
    streams decode beside them."""
    vocab = predictor.gqa_session.get_outputs()[0].shape[-1]
    requests = _requests(vocab, 8, seed=5)
    alone = [predictor.generate_ids([r["prompt"]], r["max_new_tokens"], sampler=r["sampler"]())[0]
             for r in requests]  # fmt: skip
    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=8
    )
    monkeypatch.setattr(batcher, "_check_ids", lambda prompt: None)
    bad = [[vocab + 7, 3, 4], [5, 6, vocab + 1]]
    results: list = [None] * (len(requests) + len(bad))
    start = threading.Barrier(len(results))

    def run(i):
        prompt, n, sampler = (
            (requests[i]["prompt"], requests[i]["max_new_tokens"], requests[i]["sampler"]())
            if i < len(requests) else (bad[i - len(requests)], 10, None)
        )  # fmt: skip
        start.wait()
        try:
            results[i] = list(batcher.stream(prompt, n, sampler=sampler))
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batcher.close()
    assert results[: len(requests)] == alone
    assert all(isinstance(e, Exception) for e in results[len(requests) :]), results[-2:]


def test_a_stream_closed_early_frees_its_row(predictor):
    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=1
    )
    first = batcher.stream([3, 4, 5], 15)
    assert isinstance(next(first), int)
    first.close()  # the client went away: its row is given to the next request
    second = list(batcher.stream([7, 8], 6))
    assert second == predictor.generate_ids([[7, 8]], 6)[0]
    assert batcher.active == [] and not batcher.waiting
    batcher.close()


def test_a_prompt_admitted_whole_takes_one_step_fewer_than_its_ids(predictor):
    """The admitting run's logits give a whole prompt's first id; steps give the rest (what
    `bench/llm_cpu.py`'s served ceiling counts)."""
    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=2
    )
    ids = list(batcher.stream([3, 4, 5], 9))
    batcher.close()
    assert ids == predictor.generate_ids([[3, 4, 5]], 9)[0] and len(ids) == 9
    assert batcher.steps == 8 and batcher.rows_stepped == 8


def test_async_streams_equal_the_ids_alone_and_free_rows_when_closed(predictor):
    """`astream` (what the server awaits): the same ids, no thread waiting; a stream closed
    or cancelled early gives its row to the next request."""
    import asyncio

    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=2
    )
    prompts = [[3, 4, 5], [7, 8], [2], [9, 1, 1, 4]]

    async def run():
        async def one(prompt):
            return [token async for token in batcher.astream(prompt, 9)]

        together = await asyncio.gather(*(one(p) for p in prompts))  # 4 requests, 2 rows
        closed = batcher.astream([3, 4, 5], 15)
        assert isinstance(await anext(closed), int)
        await closed.aclose()
        waiting = asyncio.ensure_future(anext(batcher.astream([6, 6], 15)))
        await asyncio.sleep(0)
        waiting.cancel()  # e.g. a request timeout
        after = await one([7, 8])
        with pytest.raises(ValueError, match="maximum sequence length"):
            await one([1] * predictor.gqa["max_length"])
        return together, after

    together, after = asyncio.run(run())
    assert together == [predictor.generate_ids([p], 9)[0] for p in prompts]
    assert after == together[1]
    deadline = time.monotonic() + 5
    while (batcher.active or batcher.waiting) and time.monotonic() < deadline:
        time.sleep(0.01)  # the loop drops the cancelled request at its next step
    assert batcher.active == [] and not batcher.waiting
    batcher.close()


def test_a_stream_past_its_deadline_raises_and_frees_its_row(predictor):
    """The server's request timeout: one timer per stream (not one per id) ends it with
    `TimeoutError` — past already, waiting for a row, or part way through — and the loop
    stops computing it, so its row goes to the next request."""
    import asyncio

    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=1
    )
    release, drawn = threading.Event(), []

    def gated(logits):  # greedy; the draw after the third waits for `release` (a slow step)
        if len(drawn) == 3:
            release.wait(30)
        drawn.append(1)
        return logits.argmax(-1)

    async def run():
        with pytest.raises(TimeoutError, match="deadline"):
            await anext(batcher.astream([3, 4, 5], 9, deadline=time.perf_counter() - 1))
        holder = batcher.astream([3, 4, 5], 30, sampler=gated, deadline=time.perf_counter() + 3)
        got = [await anext(holder) for _ in range(3)]  # then the one row is held
        waiter = batcher.astream([7, 8], 9, deadline=time.perf_counter() + 0.2)
        with pytest.raises(TimeoutError):
            await anext(waiter)  # never admitted
        await waiter.aclose()
        with pytest.raises(TimeoutError):
            await anext(holder)  # its deadline passes mid-stream
        await holder.aclose()
        release.set()
        in_time = [t async for t in batcher.astream([7, 8], 9, deadline=time.perf_counter() + 60)]
        return got, in_time

    try:
        got, in_time = asyncio.run(run())
    finally:
        release.set()
    assert got == predictor.generate_ids([[3, 4, 5]], 3)[0]
    assert in_time == predictor.generate_ids([[7, 8]], 9)[0]
    assert len(drawn) == 4  # the timed-out stream was not decoded further
    batcher.close()


def test_a_slow_reader_past_its_deadline_stops_its_decoding(predictor):
    """Ids are computed ahead of a reader that does not read: at the deadline the loop stops
    computing the stream, not only when the reader reaches the timeout."""
    import asyncio

    batcher = DecodeBatcher(
        predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=2
    )
    drawn = []

    def slow_greedy(logits):  # 5 ms a draw: 30 ids take 150 ms or more
        drawn.append(1)
        time.sleep(0.005)
        return logits.argmax(-1)

    async def run():
        stream = batcher.astream([3, 4, 5], 30, sampler=slow_greedy,
                                 deadline=time.perf_counter() + 0.05)  # fmt: skip
        # On a busy machine the first id may itself come past the deadline: the behaviour
        # asserted is the same either way (a TimeoutError, and the decoding stopped).
        with pytest.raises(TimeoutError):
            await anext(stream)
            await asyncio.sleep(0.5)  # reads nothing while the deadline passes
            async for _ in stream:
                pass
        await stream.aclose()

    asyncio.run(run())
    assert len(drawn) < 25, len(drawn)  # 30 when the deadline only reached the reader
    batcher.close()


def test_steps_run_on_buckets_of_rows_near_the_requests_in_flight(predictor):
    """A step's cost follows its rows (20 rows cost 7.4 ms where 32 cost 10.7 on the toy
    Llama): buckets are 1, 2, 4 and every multiple of 4, capped at the capacity."""
    session, spec = predictor.gqa_session, predictor.gqa
    assert sorted(BucketedCache(session, spec, 32).bindings) == [1, 2, 4, 8, 12, 16, 20, 24, 28, 32]
    assert sorted(BucketedCache(session, spec, 5).bindings) == [1, 2, 4, 5]
    assert sorted(BucketedCache(session, spec, 1).bindings) == [1]
    assert [BucketedCache(session, spec, 32).bucket(n) for n in (1, 3, 5, 9, 21, 32)] == [
        1, 4, 8, 12, 24, 32]  # fmt: skip


def test_cache_buffers_are_zeroed_mappings_of_their_own(predictor):
    """Key/value caches are anonymous mappings, not `np.zeros`, whose huge-page advice made
    the first token of each new row stall 0.4 s where the kernel compacts memory on a fault
    (SmolLM2-135M's shape, 32 rows). Each buffer is zeros, writable, and its own memory."""
    import mmap

    from keras_attn_serving.generation import BoundCache, zeroed

    cache = BucketedCache(predictor.gqa_session, predictor.gqa, 4)
    alone = BoundCache(predictor.gqa_session, predictor.gqa, 1)
    for buffer in [*cache.buffers, zeroed((2, 3, 5))]:
        base = buffer
        while isinstance(base, np.ndarray | memoryview):
            base = base.base if isinstance(base, np.ndarray) else base.obj
        assert isinstance(base, mmap.mmap), type(base)
        assert buffer.dtype == np.float32 and buffer.flags.writeable and not buffer.any()
    assert len(alone.buffers) == len(cache.buffers) == 2 * predictor.gqa["layers"]
    cache.buffers[0][1, 0, 2] = 1.0
    assert cache.buffers[0].sum() == predictor.gqa["key_dim"] and not cache.buffers[1].any()
    assert zeroed((2, 3, 5)).shape == (2, 3, 5) and zeroed((0, 4)).shape == (0, 4)


def test_the_shared_decode_loop_gets_every_core(predictor):
    """One thread runs every shared step, so its session is not cut to the cores per batch
    worker (`num_threads`, 1 of 2 here ran the steps single-threaded: 160 tokens/s for one
    stream where every core gives 250); decoding alone keeps `num_threads`."""

    def threads(**kwargs):
        session = Predictor(predictor.folder, num_threads=1, **kwargs).gqa_session
        return session.get_session_options().intra_op_num_threads

    assert threads(max_decode_rows=4) == 0  # onnxruntime's choice: every core
    assert threads(max_decode_rows=4, decode_threads=3) == 3
    assert threads() == 1


def test_bad_requests_are_value_errors(predictor):
    batcher = DecodeBatcher(predictor.gqa_session, predictor.gqa, predictor.pad_token_id)
    limit = predictor.gqa["max_length"]
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(batcher.stream([1, 2], -1))
    with pytest.raises(ValueError, match="maximum sequence length"):
        list(batcher.stream([1] * limit, 1))
    with pytest.raises(ValueError, match="prompt"):
        list(batcher.stream([], 3))
    vocab = batcher.vocabulary_size
    assert vocab == predictor.gqa_session.get_outputs()[0].shape[-1]
    with pytest.raises(ValueError, match=rf"ids outside \[0, {vocab}\): \[{vocab + 2}\]"):
        list(batcher.stream([1, vocab + 2], 3))
    assert list(batcher.stream([1, 2], 0)) == []
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(batcher.stream([1, 2], 3))
    with pytest.raises(ValueError, match="max_decode_rows"):
        DecodeBatcher(
            predictor.gqa_session, predictor.gqa, predictor.pad_token_id, max_decode_rows=0
        )


def test_predictor_streams_through_one_shared_loop(predictor):
    shared = Predictor(predictor.folder, max_decode_rows=4)
    assert Predictor(predictor.folder)._batcher() is None  # max_decode_rows=0: each alone
    prompt = [5, 9, 2]
    assert list(shared.stream_ids(prompt, 6)) == predictor.generate_ids([prompt], 6)[0]
    batcher = shared._batcher()
    assert batcher is not None and batcher is shared._batcher() and batcher.steps > 0
    shared.close()
    assert not batcher.thread.is_alive()
    # A request that loaded the predictor before it was retired decodes alone: no new loop.
    assert shared._batcher() is None
    assert list(shared.stream_ids(prompt, 6)) == predictor.generate_ids([prompt], 6)[0]
    with pytest.raises(ValueError, match="max_decode_rows"):
        Predictor(predictor.folder, max_decode_rows=-1)
