"""Iteration-level batching of an encoder-decoder: requests with sources of different lengths
share decoder steps, and each gets the ids it would get decoded alone (greedy, sampled with a
seed, with stop ids, with the checkpoint's forced first and last ids and its banned id), while
requests fail, end early or time out beside it."""

import asyncio
import shutil
import threading
import time

import keras
import numpy as np
import pytest
from keras_attn_export import export_model
from keras_attn_serving import Predictor
from keras_attn_serving.sampling import Sampler
from keras_attn_serving.seq2seq import EncoderDecoder
from keras_attn_serving.seq2seq_batching import Seq2SeqBatcher

from keras_attn.models import Seq2SeqBackbone, Seq2SeqLM

pytestmark = pytest.mark.tf_only
VOCAB, START, END, FIRST = 61, 2, 3, 5


# "learned": BART's layout (learned positions at an offset, a forced first and last id, the
# padding id banned); "relative": T5's (bucketed relative positions, RMSNorm, no length limit).
@pytest.fixture(scope="module", params=["learned", "relative"])
def predictor(request, tmp_path_factory):
    keras.utils.set_random_seed(11)
    common = dict(hidden_dim=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                  dropout=0.0, decoder_start_token_id=START, forced_eos_token_id=END)  # fmt: skip
    if request.param == "learned":
        backbone = Seq2SeqBackbone(
            VOCAB,
            40,
            position_encoding="learned",
            position_offset=2,
            forced_bos_token_id=FIRST,
            suppress_padding=True,
            **common,
        )
    else:
        backbone = Seq2SeqBackbone(VOCAB, None, position_encoding="relative",
                                   normalization="rms_norm", **common)  # fmt: skip
    lm = Seq2SeqLM(backbone)
    folder = tmp_path_factory.mktemp("s2s_batched") / request.param
    export_model(lm, folder, formats=("onnx",), batch_sizes=(1, 2), sequence_lengths=(4, 9),
                 verbose=False)  # fmt: skip
    loaded = Predictor(folder)
    assert loaded.encoder_decoder is not None and loaded.encoder_decoder.per_row_index
    loaded.lm = lm
    return loaded


def _batcher(predictor, rows=8):
    return Seq2SeqBatcher(predictor.encoder_decoder, max_decode_rows=rows)


def _requests(count, seed):
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        source = [int(t) for t in rng.integers(4, VOCAB, size=int(rng.integers(1, 14)))]
        sampled = i % 2 == 1
        requests.append({
            "source": source,
            "max_new_tokens": int(rng.integers(1, 16)),
            "stop": [],
            "sampler": (lambda s=500 + i, k=[None, 5][i % 4 == 1]: Sampler(
                "sample", temperature=0.9, top_k=k, seed=s)) if sampled else (lambda: None),
        })  # fmt: skip
    return requests


def _alone(predictor, r):
    return predictor.generate_ids([r["source"]], r["max_new_tokens"], r["stop"],
                                  sampler=r["sampler"]())[0]  # fmt: skip


def _together(batcher, jobs):
    """Runs each `(source, max_new_tokens, stop, sampler)` in its own thread, started
    together; the ids (or the error) of each."""
    results: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i):
        source, n, stop, sampler = jobs[i]
        start.wait()
        try:
            results[i] = list(batcher.stream(source, n, stop, sampler))
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_shared_steps_give_each_request_its_ids_alone(predictor, monkeypatch):
    requests = _requests(14, seed=0)
    # The widest source leaves early: the rows left step on narrower sources.
    requests[1].update(source=[7] * 16, max_new_tokens=2, stop=[])
    for r in requests[::3]:  # a stop id the request meets: its third new id decoded alone
        ids = _alone(predictor, {**r, "max_new_tokens": 15})
        r["stop"], r["max_new_tokens"] = [ids[2]], 15
    alone = [_alone(predictor, r) for r in requests]
    widths = []
    run_decoder = predictor.encoder_decoder.run_decoder

    def recording(*args):
        widths.append(args[-1].shape[1])  # the sources' width
        return run_decoder(*args)

    monkeypatch.setattr(predictor.encoder_decoder, "run_decoder", recording)
    batcher = _batcher(predictor)
    jobs = [(r["source"], r["max_new_tokens"], r["stop"], r["sampler"]()) for r in requests]
    together = _together(batcher, jobs)
    batcher.close()
    assert together == alone
    assert any(len(ids) < r["max_new_tokens"] for ids, r in zip(alone, requests, strict=True))
    # Steps were shared (14 requests, at most 8 rows): more than two rows a step on average.
    assert batcher.rows_stepped > 2 * batcher.steps > 0
    # The sources' width followed the widest in flight, down as well as up.
    assert max(widths) == 16 > widths[-1]
    lm = predictor.lm
    greedy = [r for r in requests if r["sampler"]() is None and not r["stop"]][:3]
    for r in greedy:  # and alone is Keras `generate`, forcing and ban included
        keras_ids = lm.generate([r["source"]], r["max_new_tokens"])[0]
        assert keras_ids == alone[requests.index(r)]
    forced_first = predictor.encoder_decoder.forced_bos_token_id
    if forced_first is not None:  # the first id is forced, the last of a full row is END
        assert all(ids[0] in (FIRST, END) for ids in alone if ids), alone
    assert all(ids[-1] == END for ids, r in zip(alone, requests, strict=True)
               if len(ids) == r["max_new_tokens"] and not r["stop"])  # fmt: skip


def test_a_request_the_encoder_fails_on_fails_alone(predictor, monkeypatch):
    """Sources that got past the check (forced here) fail in the encoder run they share
    with 7 and with 1 others: the run is retried source by source, only theirs fail, and
    the others decode as alone. All are queued at once, so the runs are those groups."""
    import queue

    from keras_attn_serving.decode_requests import _END

    requests = _requests(8, seed=5)
    alone = [_alone(predictor, r) for r in requests]
    batcher = _batcher(predictor, rows=16)
    monkeypatch.setattr(batcher, "_check_ids", lambda prompt: None)
    bad = [[4, VOCAB + 7, 6], [4, VOCAB + 9]]  # by length: one in each run of 8
    jobs = [(r["source"], r["max_new_tokens"], r["sampler"]()) for r in requests]
    jobs += [([9] * (30 + k), 3, None) for k in range(2)]  # the second run's good ones
    jobs.insert(2, (bad[0], 6, None))
    jobs.append((bad[1] + [5] * 30, 6, None))
    outs = [queue.SimpleQueue() for _ in jobs]
    runs = []
    encode = predictor.encoder_decoder.encoder.run
    monkeypatch.setattr(predictor.encoder_decoder, "encoder",
                        type("Recorded", (), {"run": lambda self, names, feeds: (
                            runs.append(len(feeds["encoder_token_ids"])),
                            encode(names, feeds))[1]})())  # fmt: skip
    with batcher.lock:  # the loop takes them all in one admission
        for (source, n, sampler), out in zip(jobs, outs, strict=True):
            batcher._submit(source, n, [], sampler, out)
    results = []
    for out in outs:
        items = []
        while (item := out.get(timeout=60)) is not _END:
            items.append(item)
        failed = [i for i in items if isinstance(i, Exception)]
        results.append(failed[0] if failed else items)
    batcher.close()
    # Two runs (8 sources, then the other 4), each failed, then retried source by source.
    assert runs == [8] + [1] * 8 + [4] + [1] * 4, runs
    good = [k for k, (source, _, _) in enumerate(jobs) if source not in (bad[0], jobs[-1][0])]
    assert [results[k] for k in good[:8]] == alone
    assert [results[k] for k in good[8:]] == [predictor.generate_ids([[9] * (30 + k)], 3)[0]
                                              for k in range(2)]  # fmt: skip
    assert isinstance(results[2], Exception) and isinstance(results[-1], Exception)


def test_sources_the_encoder_cannot_take_are_refused_by_name(predictor):
    batcher = _batcher(predictor)
    with pytest.raises(ValueError, match=rf"ids outside \[0, {VOCAB}\): \[{VOCAB + 7}\]"):
        list(batcher.stream([4, VOCAB + 7], 3))
    with pytest.raises(ValueError, match=r"ids outside \[0, 61\): \[-2\]"):
        list(batcher.stream([4, -2], 3))
    limit = predictor.manifest.max_sequence_length
    if limit is not None:  # learned positions: a table of `limit` rows
        with pytest.raises(ValueError, match=f"a source of {limit + 1} ids is longer than the "
                                             f"encoder takes \\({limit}\\)"):  # fmt: skip
            list(batcher.stream([4] * (limit + 1), 3))
        with pytest.raises(ValueError, match="longer than the encoder takes"):
            predictor.generate_ids([[4] * (limit + 1)], 3)  # alone: the same check
    with pytest.raises(ValueError, match="outside"):
        predictor.generate_ids([[4, VOCAB]], 3)
    batcher.close()


def test_closed_cancelled_and_late_streams_free_their_rows(predictor):
    batcher = _batcher(predictor, rows=1)
    first = batcher.stream([7, 8, 9], 15)
    assert isinstance(next(first), int)
    first.close()  # the client went away: its row is given to the next request
    assert list(batcher.stream([7, 8], 6)) == predictor.generate_ids([[7, 8]], 6)[0]

    release = threading.Event()

    def gated(logits):  # greedy; every draw after the first waits for `release`
        if gated.drawn:
            release.wait(30)
        gated.drawn += 1
        return logits.argmax(-1)

    gated.drawn = 0

    async def run():
        with pytest.raises(TimeoutError, match="deadline"):
            await anext(batcher.astream([4, 5], 9, deadline=time.perf_counter() - 1))
        holder = batcher.astream([4, 5, 6], 20, sampler=gated)
        await anext(holder)  # the one row is held
        waiter = batcher.astream([7, 8], 9, deadline=time.perf_counter() + 0.2)
        with pytest.raises(TimeoutError):
            await anext(waiter)  # never admitted
        await waiter.aclose()
        await holder.aclose()
        release.set()
        waiting = asyncio.ensure_future(anext(batcher.astream([6, 6], 15)))
        await asyncio.sleep(0)
        waiting.cancel()  # e.g. a request timeout
        return [t async for t in batcher.astream([9, 4, 4, 7], 9)]

    try:
        after = asyncio.run(run())
    finally:
        release.set()
    assert gated.drawn <= 2  # the closed stream was not decoded further
    assert after == predictor.generate_ids([[9, 4, 4, 7]], 9)[0]
    deadline = time.monotonic() + 5
    while (batcher.active or batcher.waiting) and time.monotonic() < deadline:
        time.sleep(0.01)  # the loop drops the cancelled request at its next step
    assert batcher.active == [] and not batcher.waiting
    batcher.close()


def test_bad_requests_are_value_errors(predictor):
    batcher = _batcher(predictor)
    limit = predictor.encoder_decoder.max_length
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(batcher.stream([4, 5], -1))
    with pytest.raises(ValueError, match=f"the start id \\+ max_new_tokens {limit}"):
        list(batcher.stream([4, 5], limit))  # the start id and `limit` new ids
    with pytest.raises(ValueError, match="prompt"):
        list(batcher.stream([], 3))
    assert list(batcher.stream([4, 5], 0)) == []
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(batcher.stream([4, 5], 3))
    with pytest.raises(ValueError, match="max_decode_rows"):
        _batcher(predictor, rows=0)


def test_predictor_streams_through_one_shared_loop(predictor, tmp_path):
    shared = Predictor(predictor.folder, num_threads=1, max_decode_rows=4)
    assert Predictor(predictor.folder)._batcher() is None  # max_decode_rows=0: each alone
    source = [5, 9, 12, 4]
    assert list(shared.stream_ids(source, 6)) == predictor.generate_ids([source], 6)[0]
    batcher = shared._batcher()
    assert isinstance(batcher, Seq2SeqBatcher) and batcher is shared._batcher()
    assert batcher.steps > 0
    # One thread runs every shared step: the decoder gets every core, the encoder keeps
    # `num_threads`.
    threads = shared.encoder_decoder.decoder.get_session_options().intra_op_num_threads
    assert threads == 0
    assert shared.encoder_decoder.encoder.get_session_options().intra_op_num_threads == 1
    shared.close()
    assert not batcher.thread.is_alive() and shared._batcher() is None
    assert list(shared.stream_ids(source, 6)) == predictor.generate_ids([source], 6)[0]


def test_a_graph_of_one_position_for_all_rows_decodes_alone(predictor, tmp_path):
    """Graphs written before format 5 take a scalar `index`: no shared steps, the session
    keeps `num_threads`, and streams decode alone as before."""
    from keras_attn_export.seq2seq import write_seq2seq_onnx

    if predictor.manifest.max_sequence_length is None:
        pytest.skip("one layout is enough: the server's side is the same for both")
    old = tmp_path / "old"
    shutil.copytree(predictor.folder, old)
    write_seq2seq_onnx(predictor.lm, old, per_row_index=False)
    spec = predictor.manifest.seq2seq.model_dump()
    with pytest.raises(ValueError, match="one position for all rows"):
        Seq2SeqBatcher(EncoderDecoder(old, spec), 4)
    older = Predictor(old, verify=False, num_threads=1, max_decode_rows=4)
    assert older._batcher() is None
    assert older.encoder_decoder.decoder.get_session_options().intra_op_num_threads == 1
    assert list(older.stream_ids([5, 9], 6)) == predictor.generate_ids([[5, 9]], 6)[0]
