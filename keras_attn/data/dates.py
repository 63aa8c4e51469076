"""A generated translation task: dates written many ways → ISO 8601 (`1987-03-05`).

Every format is unambiguous (day-first and month-first numeric forms are never mixed within a
format, years have four digits), so the target is a function of the source, and exact match can
reach 100%. Characters are the tokens: id 0 is padding, 1 starts and 2 ends a target.
"""

import datetime
from collections.abc import Iterable, Sequence

import numpy as np

PAD, START, END = 0, 1, 2
_CHARS = " ,-./0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VOCABULARY = ["<pad>", "<start>", "<end>", *_CHARS]
_IDS = {ch: i for i, ch in enumerate(VOCABULARY)}


def _ordinal(day):
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


FORMATS = [
    lambda d: d.strftime("%B %-d, %Y"),  # March 5, 1987
    lambda d: d.strftime("%-d %B %Y"),  # 5 March 1987
    lambda d: d.strftime("%b %-d %Y"),  # Mar 5 1987
    lambda d: d.strftime("%d.%m.%Y"),  # 05.03.1987 (day first)
    lambda d: d.strftime("%m/%d/%Y"),  # 03/05/1987 (month first)
    lambda d: d.strftime("%A, %B %-d, %Y"),  # Thursday, March 5, 1987
    lambda d: f"{_ordinal(d.day)} of {d.strftime('%B')}, {d.year}",  # 5th of March, 1987
    lambda d: d.strftime("%-d %b %Y").lower(),  # 5 mar 1987
    lambda d: d.strftime("%Y/%m/%d"),  # 1987/03/05
]


def make_dates(
    n: int, seed: int = 0, start_year: int = 1900, end_year: int = 2099
) -> list[tuple[str, str]]:
    """`n` random `(source text, ISO target)` pairs, formats drawn uniformly."""
    rng = np.random.default_rng(seed)
    first = datetime.date(start_year, 1, 1).toordinal()
    last = datetime.date(end_year, 12, 31).toordinal()
    days = rng.integers(first, last + 1, size=n)
    formats = rng.integers(0, len(FORMATS), size=n)
    pairs = []
    for day, fmt in zip(days, formats, strict=True):
        date = datetime.date.fromordinal(int(day))
        pairs.append((FORMATS[fmt](date), date.isoformat()))
    return pairs


def encode(text: str) -> list[int]:
    """Character ids of `text` (no start or end id)."""
    return [_IDS[ch] for ch in text]


def decode(ids: Iterable[int]) -> str:
    """Text of character ids; stops at the end id, skips padding and start."""
    out = []
    for i in ids:
        if i == END:
            break
        if i > END:
            out.append(VOCABULARY[i])
    return "".join(out)


def date_arrays(
    pairs: Sequence[tuple[str, str]], source_length: int = 40, target_length: int = 12
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Teacher-forcing arrays: `(sources, decoder inputs, decoder targets)`, int32, padded.

    Decoder inputs are `[START] + target`, targets are `target + [END]`.
    """
    n = len(pairs)
    sources = np.zeros((n, source_length), "int32")
    inputs = np.zeros((n, target_length), "int32")
    targets = np.zeros((n, target_length), "int32")
    for row, (source, target) in enumerate(pairs):
        s, t = encode(source)[:source_length], encode(target)
        if len(t) + 1 > target_length:
            raise ValueError(
                f"`target_length` must fit the target and one more id. Received: "
                f"target_length={target_length}, target {target!r}"
            )
        sources[row, : len(s)] = s
        inputs[row, : len(t) + 1] = [START, *t]
        targets[row, : len(t) + 1] = [*t, END]
    return sources, inputs, targets
