"""Training callbacks."""

import time

import keras


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` once `seconds` of training have passed (checked after every batch).

    Args:
        seconds: float. Wall-clock budget for training, from the start of `fit`.
    """

    def __init__(self, seconds):
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"`seconds` must be positive. Received: seconds={seconds}")
        self.seconds = seconds
        self.elapsed = 0.0

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.elapsed = time.perf_counter() - self._start
        if self.elapsed >= self.seconds:
            self.model.stop_training = True
