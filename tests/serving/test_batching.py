"""The adaptive batcher: merges what is queued, pads and trims sequences, never waits alone."""

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from keras_attn_serving.batching import Batcher
from keras_attn_serving.tuning import CapTuner


class Model:
    """Causal toy: running sums along the sequence (zero padding after a row changes nothing
    before it) and a per-row total; records the rows of each call, can be held."""

    def __init__(self):
        self.calls = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, feeds):
        self.entered.set()
        self.gate.wait()
        ids = feeds["token_ids"]
        self.calls.append(ids.shape[0])
        return {"running": np.cumsum(ids, axis=1), "total": ids.sum(axis=1)}


def expected(ids):
    return {"running": np.cumsum(ids, axis=1), "total": ids.sum(axis=1)}


def requests(n, rng):
    return [{"token_ids": rng.integers(1, 9, (int(rng.integers(1, 3)), int(rng.integers(2, 7))))}
            for _ in range(n)]  # fmt: skip


def test_queued_requests_merge_pad_and_split_back_exactly():
    model, rng = Model(), np.random.default_rng(0)
    batcher = Batcher(model, max_batch_size=8, workers=1, sequence_inputs=["token_ids"],
                      sequence_outputs=["running"])  # fmt: skip
    model.gate.clear()  # the first call holds the worker; the rest queue behind it
    feeds = requests(12, rng)
    futures = [batcher.submit(feeds[0])]
    assert model.entered.wait(10)  # the worker holds the first; the rest queue
    futures += [batcher.submit(f) for f in feeds[1:]]
    model.gate.set()
    for f, future in zip(feeds, futures, strict=True):
        got = future.result(timeout=10)
        for name, value in expected(f["token_ids"]).items():
            np.testing.assert_array_equal(got[name], value)
    assert max(model.calls) > 1 and sum(model.calls) == sum(len(f["token_ids"]) for f in feeds)
    assert all(rows <= 8 for rows in model.calls)
    batcher.close()


def test_a_lone_request_never_waits_for_company():
    model = Model()
    # A minute of max_delay: waiting for more rows with an empty queue would time out here.
    batcher = Batcher(model, max_batch_size=32, max_delay_ms=60_000, workers=1)
    out = batcher.submit({"token_ids": np.ones((1, 3), "int64")}).result(timeout=10)
    np.testing.assert_array_equal(out["total"], [3])
    assert model.calls == [1]
    batcher.close()


def test_without_sequence_inputs_only_equal_shapes_merge():
    model = Model()
    batcher = Batcher(model, max_batch_size=8, workers=1)  # padding not known to be safe
    model.gate.clear()
    first = batcher.submit({"token_ids": np.ones((1, 3), "int64")})
    assert model.entered.wait(10)
    futures = [batcher.submit({"token_ids": np.ones((1, n), "int64")}) for n in (3, 3, 4)]
    model.gate.set()
    results = [f.result(timeout=10) for f in (first, *futures)]
    assert [r["running"].shape[1] for r in results] == [3, 3, 3, 4]
    assert model.calls == [1, 2, 1]  # the held one; the two of length 3; the 4 alone
    batcher.close()


def test_errors_reach_every_caller_and_close_drains_the_queue():
    def broken(feeds):
        raise RuntimeError("session failed")

    batcher = Batcher(broken, workers=1)
    with pytest.raises(RuntimeError, match="session failed"):
        batcher.submit({"token_ids": np.ones((1, 2))}).result(timeout=10)
    batcher.close()
    model = Model()
    batcher = Batcher(model, max_batch_size=1, workers=2)
    model.gate.clear()
    futures = [batcher.submit({"token_ids": np.ones((1, 2), "int64")}) for _ in range(6)]
    threading.Timer(0.2, model.gate.set).start()
    batcher.close()  # returns once all six ran
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit({"token_ids": np.ones((1, 2))})


def test_concurrent_callers_get_their_own_rows():
    model, rng = Model(), np.random.default_rng(1)
    batcher = Batcher(model, max_batch_size=16, workers=2, sequence_inputs=["token_ids"],
                      sequence_outputs=["running"])  # fmt: skip
    feeds = requests(200, rng)
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda f: batcher.submit(f).result(timeout=30), feeds))
    for f, got in zip(feeds, results, strict=True):
        np.testing.assert_array_equal(got["running"], expected(f["token_ids"])["running"])
    batcher.close()


def held_queue(schedule, lengths, max_batch_size=8):
    """A one-worker batcher whose first call (one id) is held while `lengths` (one row each,
    ids = their length) queue behind it; returns the feeds, their futures and each call's
    `(rows, positions, padding)` once released."""
    model, batches = Model(), []
    batcher = Batcher(model, max_batch_size=max_batch_size, workers=1,
                      sequence_inputs=["token_ids"], sequence_outputs=["running"],
                      schedule=schedule,
                      on_batch=lambda rows, depth, cap, positions, padding:
                      batches.append((rows, positions, padding)))  # fmt: skip
    model.gate.clear()
    held = batcher.submit({"token_ids": np.ones((1, 1), "int64")})
    assert model.entered.wait(10)
    feeds = [{"token_ids": np.full((1, n), n, "int64")} for n in lengths]
    futures = [batcher.submit(f) for f in feeds]
    model.gate.set()
    held.result(timeout=10)
    for f, future in zip(feeds, futures, strict=True):
        got = future.result(timeout=10)
        for name, value in expected(f["token_ids"]).items():
            np.testing.assert_array_equal(got[name], value)
    batcher.close()
    return batches[1:]


def test_length_schedule_merges_near_lengths_where_arrival_order_pads():
    # 2, 20, 2, 20, ... behind a held call, 8 rows to a batch: by length, two batches with
    # no padding; in arrival order, two batches of four 2s padded to 20 (4 x 18 each).
    lengths = [2, 20] * 8
    assert held_queue("length", lengths) == [(8, 16, 0), (8, 160, 0)]
    assert held_queue("arrival", lengths) == [(8, 160, 72), (8, 160, 72)]


def test_length_schedule_keeps_batches_min_fill_real():
    # The oldest (20) takes its nearest (19, 18); a 2 would leave it 59/80 real, under 90%.
    # Then 1 takes the other 1, but not the 2 (4 of 6 real); the 2 runs alone.
    batches = held_queue("length", [20, 1, 19, 1, 18, 2])
    assert batches == [(3, 60, 3), (2, 2, 0), (1, 2, 0)]
    assert all(positions - padding >= 0.9 * positions for _, positions, padding in batches)


def test_length_schedule_drops_cancelled_requests_and_merges_multi_row_ones():
    model, batches = Model(), []
    batcher = Batcher(model, max_batch_size=8, workers=1, sequence_inputs=["token_ids"],
                      sequence_outputs=["running"],
                      on_batch=lambda *counts: batches.append(counts))  # fmt: skip
    model.gate.clear()
    held = batcher.submit({"token_ids": np.ones((1, 1), "int64")})
    assert model.entered.wait(10)
    feeds = [{"token_ids": np.full((rows, n), n, "int64")}
             for rows, n in ((2, 10), (1, 30), (3, 10), (1, 10), (2, 9))]  # fmt: skip
    futures = [batcher.submit(f) for f in feeds]
    assert futures[3].cancel()
    assert batcher.queue_depth == 5
    model.gate.set()
    held.result(timeout=10)
    for k, (f, future) in enumerate(zip(feeds, futures, strict=True)):
        if k != 3:
            np.testing.assert_array_equal(future.result(timeout=10)["running"],
                                          expected(f["token_ids"])["running"])  # fmt: skip
    batcher.close()
    # Rows 2 + 3 + 2 of lengths 10, 10, 9 in one call (the cancelled one never ran), then 30.
    assert [(rows, positions, padding) for rows, _, _, positions, padding in batches[1:]] == [
        (7, 70, 2), (1, 30, 0)]  # fmt: skip
    assert model.calls == [1, 7, 1]


def test_length_schedule_never_starves_a_request():
    """Fairness under load: a producer keeps requests of random lengths coming while the
    batcher runs; a request with `d` queued ahead of it runs within `d + 2` calls of its
    arrival (every call takes the oldest queued request). Taking the shortest first would
    leave the long ones waiting for as long as short ones keep coming."""
    model, rng = Model(), np.random.default_rng(5)
    order = []  # for each call, the request numbers it ran
    batcher = Batcher(lambda feeds: (order.append(feeds["request"][:, 0].tolist()),
                                     model(feeds))[1],
                      max_batch_size=8, workers=1, sequence_inputs=["token_ids"],
                      sequence_outputs=["running"])  # fmt: skip
    bounds, futures = {}, []
    for n in range(400):
        length = int(rng.choice([2, 3, 4, 60])) if n % 50 else 90  # a few long ones
        ahead, calls = batcher.queue_depth, len(order)
        futures.append(batcher.submit({"token_ids": np.full((1, length), 1, "int64"),
                                       "request": np.full((1, 1), n, "int64")}))  # fmt: skip
        bounds[n] = calls + ahead + 2
        if n % 7 == 0:
            threading.Event().wait(0.001)
    for future in futures:
        future.result(timeout=30)
    batcher.close()
    ran_in = {n: call for call, numbers in enumerate(order, 1) for n in numbers}
    late = {n: (ran_in[n], bounds[n]) for n in bounds if ran_in[n] > bounds[n]}
    assert not late, late
    assert max(model.calls) > 1  # it did merge under this load


@pytest.mark.parametrize(
    "bad",
    [
        {"max_batch_size": 0},
        {"max_delay_ms": -1},
        {"workers": 0},
        {"schedule": "shortest"},
        {"min_fill": 1.5},
    ],
)
def test_bad_arguments_name_themselves(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Batcher(lambda f: f, **bad)


def feed(tuner, seconds_per_row, windows, queued=None):
    """`windows` windows of batches at the tuner's cap (or the `queued` rows, if fewer),
    costing `seconds_per_row(rows)`."""
    caps = []
    for _ in range(windows * tuner.window):
        cap = tuner.cap
        caps.append(cap)
        rows = min(cap, queued or cap)
        tuner.record(rows, rows * seconds_per_row(rows))
    return caps


@pytest.mark.parametrize("best", [1, 8, 32])
def test_cap_tuner_settles_on_the_cheapest_rows(best):
    # Per-row cost falls toward `best` rows and rises after it (cache pressure): the tuner
    # walks from max_batch_size to `best` and stays there, apart from trials of neighbours.
    tuner = CapTuner(32)
    assert tuner.caps == [1, 2, 4, 8, 16, 32] and tuner.cap == 32
    cost = {1: 4.0, 2: 3.0, 4: 2.4, 8: 2.0, 16: 2.2, 32: 2.6}
    if best == 1:
        cost = {c: 1.0 + 0.1 * c for c in cost}
    if best == 32:
        cost = {c: 5.0 / c for c in cost}
    caps = feed(tuner, cost.get, 100)
    assert tuner.cap == best or tuner.trial is not None
    tail = caps[-40 * tuner.window :]
    assert tail.count(best) / len(tail) > 0.9  # trials of neighbours only now and then


def test_cap_tuner_measures_positions_where_lengths_vary():
    # Mixed lengths: a batch's seconds scale with its real positions, cheapest per position at
    # 8 rows. Per row, the lengths each window drew (1-100 tokens) would drown that out.
    rng, tuner = np.random.default_rng(3), CapTuner(32)
    cost = {1: 4.0, 2: 3.0, 4: 2.4, 8: 2.0, 16: 2.2, 32: 2.6}
    caps = []
    for _ in range(100 * tuner.window):
        rows = tuner.cap
        caps.append(rows)
        positions = int(rng.integers(1, 101, rows).sum())
        tuner.record(rows, positions * cost[rows], work=positions)
    tail = caps[-40 * tuner.window :]
    assert tail.count(8) / len(tail) > 0.9


def test_cap_tuner_backs_off_failed_trials_and_resets_when_the_load_changes():
    tuner = CapTuner(32)
    cost = {1: 4.0, 2: 3.0, 4: 2.4, 8: 2.0, 16: 2.2, 32: 2.6}
    caps = feed(tuner, cost.get, 200)
    windows = [caps[i] for i in range(0, len(caps), tuner.window)]
    # 16 is 15% cheaper than 32: a clear gain, taken after one window, and 8 tried at once.
    # 8 is 9% cheaper than 16: taken after a trial of two windows, then `pool` windows (the
    # trial's and three more) measure it before the next trial, of 4, which fails.
    assert windows[:11] == [32, 16, *[8] * 6, 4, 4, 8]
    starts = [i for i in range(8, len(windows)) if windows[i] != 8 and windows[i - 1] == 8]
    assert all(windows[i + 1] == windows[i] != windows[i + 2] for i in starts)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Each failed trial doubles the wait before the next (4, 8, 16, 32, then 64 windows at
    # most), plus the two trial windows and the window that measures the settled cap.
    assert gaps == [7, 11, 19, 35, 67]
    assert tuner.backoff == tuner.max_rest
    # The queue now forms batches of 2 (lighter load): the tuner drops to 2 and waits only
    # `rest` windows again before its next trial.
    feed(tuner, cost.get, 2, queued=2)
    assert tuner.cap in (2, 4) and tuner.backoff <= 2 * tuner.rest


def test_cap_tuner_ignores_noise_within_the_margin_and_one_row_caps():
    tuner = CapTuner(16)
    feed(tuner, lambda cap: 1.0 + 0.01 * (cap % 3), 40)  # within 5%: never worth moving
    assert tuner.index == len(tuner.caps) - 1
    single = CapTuner(1)
    feed(single, lambda cap: 1.0, 5)
    assert single.caps == [1] and single.cap == 1 and single.trial is None
    assert CapTuner(12).caps == [1, 2, 4, 8, 12]


def test_cap_tuner_takes_a_smaller_cap_at_equal_cost_so_a_flat_stretch_hides_nothing():
    # Per-row costs measured here (BERT-small, two 1-thread sessions side by side, seq/s at
    # 1/2/4/8/16 rows: 246, 257, 267, 241, 239) under a load that queues ~13 rows: 8 rows
    # cost what 16 do, 4 are 10% cheaper. Needing 5% to go from 16 to 8 left the tuner at 16
    # (serve_load: batched 0.87-0.98x unbatched by round); a smaller cap at equal cost is taken.
    tuner = CapTuner(32)
    cost = {1: 1 / 246, 2: 1 / 257, 4: 1 / 267, 8: 1 / 241, 13: 1 / 239}
    caps = feed(tuner, lambda rows: cost[rows], 100, queued=13)
    windows = [caps[i] for i in range(0, len(caps), tuner.window)]
    # 32 forms 13-row batches: 16 holds them; 8 and 4 taken, a trial of 2 fails.
    assert windows[:16] == [32, *[8] * 6, *[4] * 6, 2, 2, 4]
    tail = caps[-40 * tuner.window :]
    assert tail.count(4) / len(tail) > 0.9
    # Larger caps still need the margin: 2% cheaper per doubling is not worth a move up.
    tuner = CapTuner(32)
    tuner.index = 0
    feed(tuner, lambda rows: 0.98 ** np.log2(rows), 40)
    assert tuner.index == 0


def test_cap_tuner_holds_the_cheapest_cap_through_noise():
    # Under the bench's traffic one window's median varies by 3-5% at a fixed cap (per batch,
    # lognormal noise of about 0.1-0.15). Held against one window, a trial of a cap 10% dearer
    # passed now and then, and a move down stuck (a move back up needs `margin`): in 4 of these
    # 20 seeded runs the settled cap left 4, for up to 28% of the batches. Against the last
    # `pool` windows, with trials of two windows, it stays in all 20 (here one is allowed).
    cost = {1: 1.3, 2: 1.1, 4: 1.0, 8: 1.1, 16: 1.3, 32: 1.5}
    left = []
    for seed in range(20):
        rng, tuner = np.random.default_rng(seed), CapTuner(32)
        tuner.index = 2
        away = 0
        for _ in range(150 * tuner.window):
            cap = tuner.cap
            tuner.record(cap, cap * cost[cap] * rng.lognormal(0, 0.15))
            away += tuner.index != 2
        left.append(away / (150 * tuner.window))
    assert sum(share > 0 for share in left) <= 1, left
    assert max(left) < 0.5, left


def test_cap_tuner_keeps_a_cap_its_larger_batches_need():
    # At cap 8 the length schedule forms mostly 2-row batches (the fill rule) and some of
    # 5-7: the median fits 2, but lowering the cap to 2 would split the larger ones. Only a
    # window whose batches all fit a smaller cap lowers it without a trial.
    tuner = CapTuner(32)
    tuner.index = 3
    for _ in range(3):
        for rows in [2] * 12 + [5, 6, 7, 7]:
            tuner.record(rows, rows * 1.0)
        tuner.trial = None  # no trials here: only the lowering rule
    assert tuner.cap == 8
    for rows in [2] * 12 + [3, 3, 1, 1]:
        tuner.record(rows, rows * 1.0)
    assert tuner.caps[tuner.index] == 4


def test_batcher_merges_up_to_the_tuned_cap():
    model = Model()
    batcher = Batcher(model, max_batch_size=8, workers=1)
    batcher.tuner.index = 1  # as if tuned down to 2 rows
    model.gate.clear()
    first = batcher.submit({"token_ids": np.ones((1, 3), "int64")})
    assert model.entered.wait(10)
    futures = [batcher.submit({"token_ids": np.ones((1, 3), "int64")}) for _ in range(5)]
    model.gate.set()
    for future in (first, *futures):
        future.result(timeout=10)
    assert model.calls == [1, 2, 2, 1]
    batcher.close()


def test_cap_tuner_starts_from_the_batches_the_queue_forms():
    # Only ~12 rows are ever queued: caps 16 and 32 form the same batches, so a trial of 16
    # against 32 would see no difference. The tuner drops to 16 (it holds the batches) and
    # its trials reach the cheaper 4.
    tuner = CapTuner(32)
    cost = {1: 3.0, 2: 2.0, 4: 1.0, 8: 1.5, 12: 2.0, 16: 2.0}
    caps = feed(tuner, lambda rows: cost[rows], 60, queued=12)
    tail = caps[-20 * tuner.window :]
    assert tail.count(4) / len(tail) > 0.7


def test_a_cancelled_request_never_fails_the_others_in_its_batch():
    """A client that times out cancels its future while queued or while its batch runs: the
    other requests of that batch still get their own results (issue 19: 121 of 640 normal
    requests got 500 'CANCELLED' when peers timed out)."""
    model, rng = Model(), np.random.default_rng(1)
    batcher = Batcher(model, max_batch_size=16, workers=1, sequence_inputs=["token_ids"],
                      sequence_outputs=["running"])  # fmt: skip
    model.gate.clear()
    feeds = requests(9, rng)
    futures = [batcher.submit(feeds[0])]
    assert model.entered.wait(10)  # the worker is busy; the rest queue behind it
    futures += [batcher.submit(f) for f in feeds[1:]]
    assert futures[3].cancel() and futures[6].cancel()  # timed out while queued
    model.gate.set()
    for n, (f, future) in enumerate(zip(feeds, futures, strict=True)):
        if n in (3, 6):
            assert future.cancelled()
            continue
        got = future.result(timeout=10)
        np.testing.assert_array_equal(got["total"], expected(f["token_ids"])["total"])
    # Cancelled rows were never run: the merged batch holds only the live requests.
    assert sum(model.calls) == sum(len(f["token_ids"]) for n, f in enumerate(feeds)
                                   if n not in (3, 6))  # fmt: skip
    # Once a batch runs, its futures can no longer be cancelled: the result is delivered.
    model.gate.clear()
    model.entered.clear()
    running = batcher.submit(feeds[1])
    assert model.entered.wait(10)
    assert not running.cancel()
    model.gate.set()
    assert (
        running.result(timeout=10)["total"].tolist()
        == expected(feeds[1]["token_ids"])["total"].tolist()
    )
    batcher.close()


def test_padding_probe_feeds_masks_within_their_range():
    """The load-time probe that decides whether requests of different lengths may be padded
    and merged: a model taking an attention mask (range [0, 2)) is probed with ones at real
    positions, so a model that masks passes and one that reads padding fails (before, the
    probe sent mask values up to 49, was refused, and merging stayed off)."""
    from types import SimpleNamespace

    from keras_attn_serving.predictor import InputError
    from keras_attn_serving.repository import _padding_is_safe

    def model(masks):
        def run(feeds):
            mask = feeds["attention_mask"]
            if mask.max() > 1 or (feeds["token_type_ids"].max() > 1):
                raise InputError("outside input_ranges")
            ids = (feeds["input_ids"] + 1) * (mask if masks else 1)  # padding counts unless masked
            return {"hidden": np.cumsum(ids, 1)[..., None] * 1.0, "pooled": ids.sum(1) * 1.0}

        return run

    specs = {name: {"name": name, "dtype": "int64", "shape": ["batch", "sequence"]}
             for name in ("input_ids", "attention_mask", "token_type_ids")}  # fmt: skip
    ranges = {"input_ids": (0, 1000), "attention_mask": (0, 2), "token_type_ids": (0, 2)}
    manifest = SimpleNamespace(vocabulary_size=1000, input_ranges=ranges)
    for masks, safe in ((True, True), (False, False)):
        predictor = SimpleNamespace(inputs=specs, manifest=manifest, run=model(masks))
        # "pooled" sums over the sequence: padding changes it unless the mask zeroes it.
        assert _padding_is_safe(predictor, list(specs), ["hidden"]) is safe


def test_the_tuner_times_batches_with_the_clock_given():
    """`time.thread_time` counts what a batch cost its thread, not the time it waited: a
    batch that sleeps 50 ms costs ~0 CPU seconds; the default clock sees the 50 ms."""
    import time

    timed = {}
    for name, clock in (("wall", time.perf_counter), ("cpu", time.thread_time)):
        queued = threading.Event()

        def sleepy(feeds, queued=queued):
            queued.wait(10)  # the first call holds until the others are queued behind it
            time.sleep(0.05)
            return {"out": feeds["token_ids"] * 2}

        batcher = Batcher(sleepy, max_batch_size=4, workers=1, clock=clock)
        seen = []
        batcher.tuner.record = lambda rows, seconds, work=None, seen=seen: seen.append(seconds)
        futures = [batcher.submit({"token_ids": np.ones((1, 3), "int64")}) for _ in range(4)]
        queued.set()
        for future in futures:
            np.testing.assert_array_equal(future.result(timeout=10)["out"], 2 * np.ones((1, 3)))
        batcher.close()
        timed[name] = seen
    assert timed["wall"] and min(timed["wall"]) >= 0.05
    assert timed["cpu"] and max(timed["cpu"]) < 0.02


def test_a_request_whose_inputs_disagree_runs_alone():
    """Token and segment ids of different lengths (or rows) used to be merged with well-formed
    requests: the padded concatenation failed, and every request of the batch got its 500."""

    def model(feeds):  # as onnxruntime's Add: the two inputs must have one shape
        if feeds["token_ids"].shape != feeds["segment_ids"].shape:
            raise RuntimeError("broadcast failed")
        return {"sum": feeds["token_ids"] + feeds["segment_ids"]}

    held, gate = threading.Event(), threading.Event()

    def run(feeds):
        held.set()
        gate.wait()
        return model(feeds)

    batcher = Batcher(run, max_batch_size=16, workers=1, sequence_inputs=["token_ids",
                      "segment_ids"], sequence_outputs=["sum"])  # fmt: skip
    good = {"token_ids": np.ones((1, 3), "int64"), "segment_ids": np.ones((1, 3), "int64")}
    futures = [batcher.submit(good)]
    assert held.wait(10)  # the worker holds the first; the rest queue behind it
    bad = [
        {"token_ids": np.ones((1, 5), "int64"), "segment_ids": np.ones((1, 3), "int64")},
        {"token_ids": np.ones((2, 3), "int64"), "segment_ids": np.ones((1, 3), "int64")},
    ]
    for k in range(12):
        futures.append(batcher.submit(bad[k % 2] if k % 4 == 1 else good))
    gate.set()
    for k, future in enumerate(futures):
        if k >= 1 and (k - 1) % 4 == 1:
            with pytest.raises(RuntimeError, match="broadcast"):
                future.result(timeout=10)
        else:
            np.testing.assert_array_equal(future.result(timeout=10)["sum"], [[2, 2, 2]])
    batcher.close()


def test_a_lone_request_never_waits_for_company_it_cannot_have():
    """A request that runs alone skips `max_delay_ms` with others queued behind it, and a
    batch that is full runs at once (it used to wait out the delay)."""
    held, gate = threading.Event(), threading.Event()

    def run(feeds):
        held.set()
        gate.wait()
        if feeds["token_ids"].shape != feeds["segment_ids"].shape:
            raise RuntimeError("broadcast failed")
        return {"sum": feeds["token_ids"] + feeds["segment_ids"]}

    batcher = Batcher(run, max_batch_size=2, max_delay_ms=60_000, workers=1,
                      sequence_inputs=["token_ids", "segment_ids"])  # fmt: skip
    good = {"token_ids": np.ones((1, 3), "int64"), "segment_ids": np.ones((1, 3), "int64")}
    first = batcher.submit(good)
    assert held.wait(10)
    alone = batcher.submit({"token_ids": np.ones((1, 5), "int64"),
                            "segment_ids": np.ones((1, 3), "int64")})  # fmt: skip
    rest = [batcher.submit(good), batcher.submit(good)]  # these two fill a batch of 2
    gate.set()
    with pytest.raises(RuntimeError, match="broadcast"):
        alone.result(timeout=10)
    for future in (first, *rest):
        assert future.result(timeout=10)["sum"].tolist() == [[2, 2, 2]]
    batcher.close()
