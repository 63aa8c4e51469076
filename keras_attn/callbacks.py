"""Training callbacks."""

import json
import os
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` once `seconds` of training have passed (checked after every batch).

    Args:
        seconds: float. Wall-clock budget for training, from the start of `fit`.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"`seconds` must be positive. Received: seconds={seconds}")
        self.seconds = seconds
        self.elapsed = 0.0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.elapsed = time.perf_counter() - self._start
        if self.elapsed >= self.seconds:
            self.model.stop_training = True


RESUME_FILE = "resume.npz"


class ResumeTraining(keras.callbacks.Callback):
    """Lets a `fit` killed at any moment (even `kill -9`) resume and end with exactly the
    weights an uninterrupted run would have.

    At the end of every epoch it writes one checkpoint, `directory/resume.npz`: every model
    variable (weights, and the dropout layers' random-seed states, which
    `keras.callbacks.BackupAndRestore` leaves out), every optimizer variable (its step count
    and moments), the epoch, and on PyTorch the global generator's state (Keras's PyTorch
    dropout draws from it). The file is written beside its final name, flushed to disk and
    renamed into place, so a kill leaves the previous checkpoint or the new one, whole. When
    `fit` starts and a checkpoint is there, it restores it and continues from the next epoch.

    Exactness also needs data whose order in epoch `k` does not depend on what ran before in
    the process: arrays with `fit(..., shuffle=False)`, or an `EpochShuffled` passed both to
    `fit(..., shuffle=False)` and here as `data` (its order is a function of the seed and the
    epoch; Keras's own shuffle would draw from the process's random state). For frequent
    checkpoints in a long pass over the data, make epochs shorter with
    `EpochShuffled(..., steps_per_epoch=s)`, not with `fit(..., steps_per_epoch=s)`: below
    the number of batches, Keras carries its data iterator over from one epoch to the next
    (epoch `k` starts at batch `k * s`), a position a process resumed at epoch `k` does not
    have (it starts at batch 0).

    What is checked: with `data`, a `fit` whose epochs are not `len(data)` steps (it was
    given a `steps_per_epoch`) is refused when training begins, before any step; one that
    asks for the batches out of order (`shuffle=True`), or does not read `data` at all
    (another dataset went to `fit`), at the end of the first epoch. With arrays nothing is:
    Keras tells callbacks neither the size of the data nor whether it shuffles, so
    `fit(x, y, steps_per_epoch=s)` with `s` below the number of batches, or with
    `shuffle=True`, resumes to other weights, silently. Wrap arrays in `EpochShuffled` to
    have them checked.

    Args:
        directory: str or path. Where the checkpoint lives (created if missing).
        data: optional `EpochShuffled`; told the epoch at each epoch's start.
    Raises:
        ValueError: when `fit` begins, if its epochs are not `len(data)` steps, or the
            checkpoint there was written by another model; when an epoch ends, if `fit` read
            `data` out of order or not at all.
    Example:
        >>> import tempfile
        >>> rows = np.linspace(0, 1, 64)[:, None]
        >>> data = EpochShuffled(rows, 2 * rows, batch_size=8, steps_per_epoch=2)
        >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> resume = ResumeTraining(tempfile.mkdtemp(), data)
        >>> _ = model.fit(data, epochs=4, shuffle=False, verbose=0, callbacks=[resume])
        >>> [path.name for path in resume.directory.iterdir()]  # after epoch 4 (one pass)
        ['resume.npz']
    """

    def __init__(
        self, directory: str | os.PathLike[str], data: "EpochShuffled | None" = None
    ) -> None:
        super().__init__()
        if not isinstance(directory, str | os.PathLike) or not str(directory):
            raise ValueError(f"`directory` must be a path. Received: directory={directory!r}")
        if data is not None and not isinstance(data, EpochShuffled):
            raise ValueError(
                f"`data` must be an EpochShuffled or None. Received: {type(data).__name__}"
            )
        self.directory = Path(directory)
        self.data = data
        self.resumed_from: int | None = None  # the epoch restored at the start of `fit`, if any

    @property
    def path(self) -> Path:
        return self.directory / RESUME_FILE

    def _variables(self):
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)  # its variables must exist to load
        return [*self.model.variables, *(optimizer.variables if optimizer is not None else [])]

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        steps = (self.params or {}).get("steps")  # fit's steps_per_epoch, else len(data)
        if self.data is not None and steps is not None and steps != len(self.data):
            raise ValueError(
                f"fit() runs {steps} steps an epoch but the EpochShuffled `data` has "
                f"{len(self.data)} batches: given `fit(steps_per_epoch=...)`, Keras carries its "
                "data iterator over from one epoch to the next, a position a resumed process "
                "does not have. Leave `steps_per_epoch` out of fit() and pass it to "
                "EpochShuffled(..., steps_per_epoch=...): its epochs are then that many "
                "batches, resumable exactly"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(f".{RESUME_FILE}.*"):  # a write a kill cut short
            stale.unlink(missing_ok=True)
        if self.path.is_file():
            self._restore()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.data is not None:
            self.data.epoch = epoch
            self.data.requested, self.data._requested_epoch = [], epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.data is not None:
            # Every epoch runs at least one step, each reading a batch: none read means
            # fit() trains on other data, whose epoch this callback does not set. (Worker
            # processes read their own copies: nothing is recorded here.)
            requested = self.data.requested
            if not requested and not self.data.use_multiprocessing:
                raise ValueError(
                    "fit() read no batch of the EpochShuffled `data` this epoch: pass the "
                    "same EpochShuffled to fit() and to ResumeTraining"
                )
            if requested != list(range(len(requested))):
                raise ValueError(
                    "fit() shuffled the batches of the EpochShuffled data from the process's "
                    f"random state (it asked for {requested[:5]}...), so a resumed run would "
                    "see another order: pass `fit(..., shuffle=False)` (EpochShuffled "
                    "already shuffles by epoch)"
                )
        self._save(epoch + 1)

    def _save(self, epoch):
        variables = self._variables()
        arrays = {f"v{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(variables)}
        meta = {"epoch": epoch, "shapes": [list(v.shape) for v in variables]}
        if keras.backend.backend() == "torch":
            # Keras's PyTorch dropout draws from torch's global generator when the layer was
            # given no seed (its fast path), not from the layer's seed state.
            import torch

            arrays["torch_rng"] = torch.get_rng_state().numpy()
        temporary = self.directory / f".{RESUME_FILE}.{os.getpid()}"
        with open(temporary, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        folder = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself reaches the disk
        finally:
            os.close(folder)

    def _restore(self):
        if not self.model.built:
            raise ValueError("ResumeTraining needs a built model: call it on a batch first")
        variables = self._variables()
        with np.load(self.path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            shapes = [list(v.shape) for v in variables]
            if meta["shapes"] != shapes:
                raise ValueError(
                    f"{self.path} holds {len(meta['shapes'])} variables that do not match this "
                    f"model and optimizer ({len(shapes)} variables): it was written by another "
                    "model; delete it or pick another `directory`"
                )
            for i, variable in enumerate(variables):
                variable.assign(stored[f"v{i}"])
            if "torch_rng" in stored.files and keras.backend.backend() == "torch":
                import torch

                torch.set_rng_state(torch.from_numpy(stored["torch_rng"]))
        self.resumed_from = meta["epoch"]
        self.model._initial_epoch = meta["epoch"]  # what fit() starts from (as BackupAndRestore)


class EpochShuffled(keras.utils.PyDataset):
    """Batches of arrays in an order fixed by `(seed, epoch)`: shuffled every epoch, yet the
    same in a process resumed at epoch `k` as in one that ran from the start (what
    `ResumeTraining` needs; `fit(shuffle=True)` draws from the process's random state).

    The data is read in passes: pass `p` is a permutation of the rows drawn from `(seed, p)`,
    cut into `ceil(rows / batch_size)` batches (the last may be smaller; each batch's rows in
    their original order). An epoch is one pass, or, given `steps_per_epoch=s`, the next `s`
    batches of the passes laid end to end: epoch `e` is their batches `e * s` to
    `e * s + s - 1`, so it may end one pass and begin the next. Short epochs checkpoint
    often with `ResumeTraining`, and resume exactly, which Keras's
    `fit(..., steps_per_epoch=s)` does not.

    Args:
        x: array, or a tuple/dict of arrays with the same first dimension.
        y: optional targets, like `x`.
        batch_size: int. Rows per batch (the last batch of a pass may be smaller).
        seed: int. The shuffling seed.
        steps_per_epoch: optional int >= 1. Batches an epoch (`len(self)`), taken in turn
            from the passes. Defaults to `None`: one pass an epoch.
    Example:
        >>> data = EpochShuffled(np.arange(10), batch_size=2, seed=3, steps_per_epoch=3)
        >>> len(data)  # 3 of a pass's 5 batches
        3
        >>> data.epoch = 1  # batches 3 and 4 of pass 0, then batch 0 of pass 1
        >>> [data[i].tolist() for i in range(len(data))]
        [[5, 7], [3, 8], [1, 4]]
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        batch_size: int = 32,
        seed: int = 0,
        steps_per_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be an integer >= 1. Received: {batch_size!r}")
        if steps_per_epoch is not None and (
            isinstance(steps_per_epoch, bool)
            or not isinstance(steps_per_epoch, int)
            or steps_per_epoch < 1
        ):
            raise ValueError(
                "`steps_per_epoch` must be an integer >= 1 or None. "
                f"Received: steps_per_epoch={steps_per_epoch!r}"
            )
        sizes = {len(a) for a in keras.tree.flatten((x, y)) if a is not None}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(f"`x` and `y` must be non-empty arrays of one length. Got {sizes}")
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.steps_per_epoch = steps_per_epoch
        self.rows = sizes.pop()
        self._pass_batches = -(-self.rows // batch_size)
        self.epoch = 0
        self.requested: list[int] = []  # batch indices asked for this epoch, in order
        self._requested_epoch = 0
        self._in_epoch = False

    def __len__(self) -> int:
        return self.steps_per_epoch or self._pass_batches

    def on_epoch_begin(self) -> None:
        self._in_epoch = True

    def on_epoch_end(self) -> None:
        """After each epoch Keras ran: the next is shuffled anew. (Keras also calls it when
        it resets its iterator, outside any epoch: not counted. `ResumeTraining` sets `epoch`
        itself at each epoch's start.)"""
        if self._in_epoch:
            self.epoch += 1
            self._in_epoch = False

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):  # past the end would read the next epoch's batches
            raise IndexError(f"batch {index} of an epoch of {len(self)} batches")
        if self._requested_epoch != self.epoch:
            self.requested, self._requested_epoch = [], self.epoch
        self.requested.append(index)
        step = self.epoch * len(self) + index  # in the passes laid end to end
        pass_, batch = divmod(step, self._pass_batches)
        order = np.random.default_rng([self.seed, pass_]).permutation(self.rows)
        rows = np.sort(order[batch * self.batch_size : (batch + 1) * self.batch_size])
        take = lambda a: None if a is None else np.asarray(a)[rows]  # noqa: E731
        x = keras.tree.map_structure(take, self.x)
        return x if self.y is None else (x, keras.tree.map_structure(take, self.y))
