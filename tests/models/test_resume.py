"""`ResumeTraining`: a `fit` killed with SIGKILL, at a step or while writing its checkpoint,
resumes and ends with exactly the weights of an uninterrupted run, dropout on, with epochs of
a pass or shorter (`EpochShuffled(steps_per_epoch=...)`)."""

import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn.callbacks import EpochShuffled, ResumeTraining

CHILD = """
import os, signal, sys
import keras, numpy as np
import keras_attn.callbacks as callbacks
from keras_attn.callbacks import EpochShuffled, ResumeTraining
from keras_attn.models import CausalLM

if keras.backend.backend() == "torch":  # see `train`
    import torch
    torch.set_num_threads(1)
folder, kill_at_step, kill_in_save = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps_per_epoch = int(sys.argv[4]) or None
keras.utils.set_random_seed(0)
ids = np.random.default_rng(0).integers(1, 60, (96, 12)).astype("int32")
data = EpochShuffled(ids[:, :-1], ids[:, 1:], batch_size=16, seed=1,
                     steps_per_epoch=steps_per_epoch)
model = CausalLM(60, 11, hidden_dim=16, num_layers=1, num_heads=2, dropout=0.1)
model.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class Kill(keras.callbacks.Callback):
    step = 0
    def on_train_batch_end(self, batch, logs=None):
        Kill.step += 1
        if Kill.step == kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

if kill_in_save:  # killed after the new checkpoint is written, before it is renamed in
    saves, replace = [], os.replace
    def replace_then_die(src, dst):
        saves.append(src)
        if len(saves) == kill_in_save:
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)
    callbacks.os.replace = replace_then_die

resume = ResumeTraining(folder + "/checkpoint", data)
model.fit(data, epochs=24 // len(data), callbacks=[resume, Kill()], verbose=0, shuffle=False)
print("RESUMED_FROM", resume.resumed_from)
np.save(folder + "/final.npy", np.concatenate([np.ravel(w) for w in model.get_weights()]))
"""


def train(folder, kill_at_step=-1, kill_in_save=0, steps_per_epoch=0):
    """24 steps of training (4 passes of 6 batches) in epochs of `steps_per_epoch` batches,
    or of a pass (0). One thread for the math libraries: a parallel sum's rounding follows
    the number of threads, which MKL picks by the machine's load (`MKL_DYNAMIC`), so two
    processes on a busy machine differed by 7e-5 on PyTorch (CI, 2026-11-24)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_DYNAMIC": "FALSE"}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(kill_at_step),
                             str(kill_in_save), str(steps_per_epoch)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def finish(process):
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


@pytest.mark.slow
def test_killed_training_resumes_to_identical_weights_with_dropout(tmp_path):
    folders = {name: tmp_path / name for name in ("whole", "step", "save")}
    for folder in folders.values():
        folder.mkdir()
    # 6 batches an epoch, 4 epochs: killed at step 9 (inside epoch 2), and while the second
    # checkpoint is being renamed in (the first stays whole).
    first = [train(folders["whole"]), train(folders["step"], kill_at_step=9)]
    (code, _, err), (killed, _, _) = (finish(p) for p in first)
    assert code == 0, err[-3000:]
    assert killed == -signal.SIGKILL
    died_saving = finish(train(folders["save"], kill_in_save=2))[0]
    assert died_saving == -signal.SIGKILL
    assert list((folders["save"] / "checkpoint").glob(".resume.npz.*"))  # the cut-short write
    reference = np.load(folders["whole"] / "final.npy")
    for name, epoch in (("step", 1), ("save", 1)):
        code, out, err = finish(train(folders[name]))
        assert code == 0, err[-3000:]
        assert f"RESUMED_FROM {epoch}" in out
        assert not list((folders[name] / "checkpoint").glob(".resume.npz.*"))
        resumed = np.load(folders[name] / "final.npy")
        assert np.abs(resumed - reference).max() == 0.0, name


@pytest.mark.slow
def test_killed_training_in_short_epochs_resumes_to_identical_weights(tmp_path):
    """Epochs of 4 of a pass's 6 batches: epoch 1 is batches 4, 5 of pass 0 and 0, 1 of pass
    1. Killed at step 7, inside it, the run resumes at epoch 1, mid-pass, where a process
    given Keras's `fit(steps_per_epoch=4)` would restart at the data's first batch."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    first = [train(whole, steps_per_epoch=4), train(killed, kill_at_step=7, steps_per_epoch=4)]
    (code, out, err), (died, _, _) = (finish(p) for p in first)
    assert code == 0, err[-3000:]
    assert "RESUMED_FROM None" in out
    assert died == -signal.SIGKILL
    code, out, err = finish(train(killed, steps_per_epoch=4))
    assert code == 0, err[-3000:]
    assert "RESUMED_FROM 1" in out
    resumed, reference = np.load(killed / "final.npy"), np.load(whole / "final.npy")
    assert np.abs(resumed - reference).max() == 0.0


def test_fit_steps_per_epoch_below_the_data_is_refused_before_any_step(tmp_path):
    """Given `steps_per_epoch`, Keras carries its iterator from one epoch to the next (epoch 1
    starts at batch 4), a place a resumed process does not have: it started at batch 0."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    before = model.get_weights()
    data = EpochShuffled(np.ones((12, 3)), np.ones((12, 2)), batch_size=2)  # 6 batches
    with pytest.raises(ValueError, match=r"pass it to EpochShuffled\(..., steps_per_epoch="):
        model.fit(data, epochs=3, steps_per_epoch=4, shuffle=False, verbose=0,
                  callbacks=[ResumeTraining(tmp_path, data)])  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert not (tmp_path / "resume.npz").exists()
    # The same short epochs from EpochShuffled: accepted.
    short = EpochShuffled(np.ones((12, 3)), np.ones((12, 2)), batch_size=2, steps_per_epoch=4)
    resume = ResumeTraining(tmp_path, short)
    model.fit(short, epochs=3, shuffle=False, verbose=0, callbacks=[resume])
    assert (tmp_path / "resume.npz").is_file()


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    def model(width):
        built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])
        built.compile("adam", "mse")
        return built

    x, y = np.ones((4, 3)), np.ones((4, 2))
    model(2).fit(x, y, epochs=1, verbose=0, callbacks=[ResumeTraining(tmp_path)])
    assert (tmp_path / "resume.npz").is_file()
    with pytest.raises(ValueError, match="do not match this model"):
        other = model(5)
        other.fit(x, np.ones((4, 5)), epochs=1, verbose=0, callbacks=[ResumeTraining(tmp_path)])
    data = EpochShuffled(np.ones((12, 3)), np.ones((12, 2)), batch_size=1)  # 12! orders
    with pytest.raises(ValueError, match=r"pass `fit\(..., shuffle=False\)`"):
        model(2).fit(data, epochs=1, verbose=0,
                     callbacks=[ResumeTraining(tmp_path / "other", data)])  # fmt: skip
    other = EpochShuffled(np.ones((12, 3)), np.ones((12, 2)), batch_size=1)
    with pytest.raises(ValueError, match="read no batch of the EpochShuffled `data`"):
        model(2).fit(other, epochs=1, verbose=0, shuffle=False,
                     callbacks=[ResumeTraining(tmp_path / "third", data)])  # fmt: skip
    with pytest.raises(ValueError, match="`directory` must be a path"):
        ResumeTraining(None)
    with pytest.raises(ValueError, match="`data` must be an EpochShuffled"):
        ResumeTraining(tmp_path, data=[1])


def test_epoch_shuffled_order_is_a_function_of_seed_and_epoch():
    x = np.arange(10)
    data = EpochShuffled(x, x * 2, batch_size=4, seed=3)
    assert len(data) == 3

    def epoch_rows(epoch):
        data.epoch = epoch
        batches = [data[i] for i in range(len(data))]
        assert all(np.array_equal(bx * 2, by) for bx, by in batches)
        return np.concatenate([bx for bx, _ in batches])

    first, again, second = epoch_rows(0), epoch_rows(0), epoch_rows(1)
    assert sorted(first) == list(range(10)) and np.array_equal(first, again)
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError, match="one length"):
        EpochShuffled(x, x[:3])


def test_epoch_shuffled_short_epochs_take_the_passes_batches_in_turn():
    data = EpochShuffled(np.arange(10), batch_size=2, seed=3, steps_per_epoch=3)
    # The passes: np.random.default_rng([seed, pass]).permutation(rows).
    passes = [[9, 6, 0, 2, 1, 4, 7, 5, 3, 8], [4, 1, 2, 8, 5, 0, 7, 9, 6, 3],
              [7, 4, 1, 8, 6, 0, 2, 9, 3, 5]]  # fmt: skip
    assert [np.random.default_rng([3, p]).permutation(10).tolist() for p in range(3)] == passes
    # Their batches, each pair sorted: pass 0 is [6, 9] [0, 2] [1, 4] [5, 7] [3, 8], pass 1
    # [1, 4] [2, 8] [0, 5] [7, 9] [3, 6], pass 2 [4, 7] [1, 8] ... An epoch takes the next 3.
    epochs = [
        [[6, 9], [0, 2], [1, 4]],  # pass 0, batches 0-2
        [[5, 7], [3, 8], [1, 4]],  # pass 0, batches 3-4; pass 1, batch 0
        [[2, 8], [0, 5], [7, 9]],  # pass 1, batches 1-3
        [[3, 6], [4, 7], [1, 8]],  # pass 1, batch 4; pass 2, batches 0-1
    ]
    assert len(data) == 3
    for epoch, batches in enumerate(epochs):
        data.epoch = epoch
        assert [data[i].tolist() for i in range(3)] == batches, epoch
    with pytest.raises(IndexError):
        data[3]  # would be the next epoch's first batch
    # Without `steps_per_epoch`, an epoch is a pass, as it always was.
    whole = EpochShuffled(np.arange(10), batch_size=2, seed=3)
    assert len(whole) == 5
    whole.epoch = 1
    assert [whole[i].tolist() for i in range(5)] == [[1, 4], [2, 8], [0, 5], [7, 9], [3, 6]]


@pytest.mark.parametrize("steps_per_epoch", [0, -2, 2.5, True, "3"])
def test_epoch_shuffled_refuses_a_bad_steps_per_epoch(steps_per_epoch):
    with pytest.raises(ValueError, match="`steps_per_epoch` must be an integer >= 1"):
        EpochShuffled(np.arange(10), batch_size=2, steps_per_epoch=steps_per_epoch)


def test_epoch_shuffled_reshuffles_each_epoch_of_fit_without_resume_training():
    """Its epoch stayed 0 unless `ResumeTraining` set it: every epoch saw one order."""
    seen = []

    class Rows(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append([data.requested[:], data.epoch])

    data = EpochShuffled(np.arange(12.0)[:, None], np.zeros((12, 1)), batch_size=3, seed=2)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(data, epochs=3, verbose=0, shuffle=False, callbacks=[Rows()])
    # A new order each epoch (JAX and PyTorch also run one peek pass before the first epoch,
    # so the count can be one more than fit's).
    assert len({epoch for _, epoch in seen}) == 3 and data.epoch in (3, 4)
    # Each epoch asks for every batch in order (Keras peeks at the first ones before epoch 0).
    assert all(requested[-4:] == [0, 1, 2, 3] for requested, _ in seen)
    orders = []
    for epoch in range(3):
        data.epoch = epoch
        orders.append(np.concatenate([data[i][0][:, 0] for i in range(len(data))]).tolist())
    assert len({tuple(order) for order in orders}) == 3  # three different orders
