"""`CapTuner`: the row cap a `Batcher` merges up to, tuned under load by trials of
neighbouring caps against the measured cost per row (or per real token)."""

import collections
import threading
from collections.abc import Iterable


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class CapTuner:
    """The row cap a `Batcher` merges up to, tuned under load from measured seconds per row.

    Merging more rows is not always cheaper per row: on 2 CPU cores a BERT-small batch of 32 ran
    fewer sequences/s than batches of 4 (`bench/serve_load.py`). Starting at `max_batch_size`,
    the tuner measures seconds per row over windows of `window` batches run under load (merged
    with others, or leaving others queued). Its reference is the median over the settled cap's
    last `pool` windows. It tries the neighbouring cap (half or double, within
    `1..max_batch_size`) for `trial_windows` windows and moves there if the trial's median is at
    least `margin` cheaper (a larger cap) or no dearer (a smaller cap: less latency, and where
    costs are flat the walk goes on toward unbatched). After a move it measures the new cap for
    `pool` windows, then tries the next cap the same way. A trial whose first window is
    `clear_gain` cheaper moves at once and the next cap is tried at once, so a steep cost curve
    (arrival-order padding) is walked down as fast as before. (One window's median varies by
    3-5% under mixed traffic: held to one window, a cap 10% dearer passed a trial now and then,
    and a larger cap 8% cheaper seldom did.) After a failed trial it tries the other side,
    `rest` windows later; each further failed trial doubles that wait (up to `max_rest`
    windows), so once the cap has settled, trials of worse caps cost a shrinking share of the
    batches. A move, or a change in the batch sizes the queue forms (the load changed: the
    reference is then measured afresh), resets the wait to `rest`. A cap above every batch of a
    window is first lowered to the smallest cap holding them (it changed nothing), so trials
    compare sizes that really run; where only the median batch fits a smaller cap, the larger
    ones still need this one. Lone requests on an empty queue say nothing about the cap and are
    not counted.
    """

    def __init__(
        self,
        max_batch_size: int,
        window: int = 16,
        margin: float = 0.05,
        rest: int = 4,
        max_rest: int = 64,
        pool: int = 4,
        trial_windows: int = 2,
        clear_gain: float = 0.15,
    ) -> None:
        caps, cap = [], 1
        while cap < max_batch_size:
            caps.append(cap)
            cap *= 2
        self.caps = [*caps, max_batch_size]
        self.window, self.margin, self.rest, self.max_rest = window, margin, rest, max_rest
        self.pool, self.trial_windows, self.clear_gain = pool, trial_windows, clear_gain
        self.backoff = rest  # windows to wait after the next failed trial
        self.typical: int | None = None  # median rows per batch, last settled window at this cap
        self.index = len(self.caps) - 1
        self.trial: int | None = None  # index of the cap on trial, if any
        self.direction = -1
        self.settled_cost: float | None = None
        # Costs of the settled cap's last `pool` windows: the reference a trial is held to.
        self._settled: collections.deque[float] = collections.deque(maxlen=pool * window)
        self.wait = 0  # windows before the next trial
        self._samples: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def _clearly_cheaper(self, cost: float) -> bool:
        assert self.settled_cost is not None  # set by the window that began the trial
        return cost <= self.settled_cost * (1 - self.clear_gain)

    @property
    def cap(self) -> int:
        return self.caps[self.index if self.trial is None else self.trial]

    def record(self, rows: int, seconds: float, work: int | None = None) -> None:
        """One batch of `rows`, run under load, took `seconds`. `work`: what it computed, if
        not the rows (its real positions, where lengths vary: seconds per row would then
        measure the lengths a window drew more than the cap)."""
        if len(self.caps) == 1 or rows < 1:
            return
        with self._lock:
            self._samples.append((seconds / (work or rows), rows))
            count = len(self._samples)
            if count < self.window:
                return
            if self.trial is not None and count < self.window * self.trial_windows:
                # A trial that is clearly cheaper after one window is not run longer.
                if count > self.window or not self._clearly_cheaper(
                    _median([c for c, _ in self._samples])
                ):
                    return
            costs = [c for c, _ in self._samples]
            cost = _median(costs)
            rows_seen = sorted(r for _, r in self._samples)
            typical = rows_seen[len(rows_seen) // 2]
            self._samples = []
            if self.trial is not None:
                # A larger cap must be `margin` cheaper; a smaller one only no dearer: the
                # same throughput at lower latency, and a flat stretch of the cost curve
                # (8 rows as dear as 16) does not hide a cheaper cap beyond it (4).
                smaller = self.trial < self.index
                assert self.settled_cost is not None  # set by the window that began the trial
                if cost <= self.settled_cost * (1 if smaller else 1 - self.margin):
                    # Moved. The trial's windows begin this cap's reference; once `pool`
                    # windows make it, the next cap the same way is tried, or at once after
                    # a clear gain (a walk down a steep cost curve, arrival-order padding).
                    clear = self._clearly_cheaper(cost)
                    self.index, self.settled_cost, self.trial = self.trial, cost, None
                    self._settled.clear()
                    self._settled.extend(costs)
                    self.backoff, self.typical = self.rest, None
                    self.wait = self.pool - 1
                    step = self.index + self.direction
                    if clear and 0 <= step < len(self.caps):
                        self.trial, self.wait = step, 0
                else:
                    self.direction, self.wait = -self.direction, self.backoff
                    self.backoff = min(2 * self.backoff, self.max_rest)
                    self.trial = None
                return
            if self.typical is not None and not 0.5 <= typical / self.typical <= 2:
                # The load changed: so did the cost of this cap; measure it afresh.
                self.backoff, self.wait = self.rest, min(self.wait, self.rest)
                self._settled.clear()
            self._settled.extend(costs)
            self.settled_cost = _median(self._settled)
            self.typical = typical
            # A cap far above the batches the queue actually forms changes nothing: start
            # from the smallest cap that still holds them, so trials compare real sizes.
            while self.index > 0 and self.caps[self.index - 1] >= rows_seen[-1]:
                self.index -= 1
            if self.wait:
                self.wait -= 1
                return
            step = self.index + self.direction
            if not 0 <= step < len(self.caps):
                self.direction = -self.direction
                step = self.index + self.direction
            self.trial = step
