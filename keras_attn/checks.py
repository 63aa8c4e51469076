"""Argument checks shared across the package: each raises a `ValueError` naming the argument."""

from collections.abc import Collection, Iterable
from typing import Any


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_positive_ints(**values: Any) -> None:
    for name, value in values.items():
        check_positive_int(name, value)


def check_rate(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value!r}")


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}. Received: {name}={value!r}")


def check_non_negative_ints(**values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"`{name}` must be a non-negative integer. Received: {name}={value!r}")


# Arguments renamed so that one thing has one name everywhere (issue 25).
RENAMED = {
    "sequence_length": "max_sequence_length",
    "pad_id": "pad_token_id",
    "encoder_kwargs": "backbone_kwargs",
}


def check_renamed(kwargs: dict[str, Any], names: Iterable[str] = tuple(RENAMED)) -> None:
    """`TypeError` naming the new name of any old keyword argument (of `names`) in `kwargs`."""
    for old in names:
        if old in kwargs:
            new = RENAMED[old]
            raise TypeError(f"`{old}` is now called `{new}`. Received: {old}={kwargs[old]!r}")


# Hugging Face's names for arguments that have another name here.
HF_NAMES = {
    "do_sample": "sampler='sample' (or 'greedy')",
    "eos_token_id": "stop_token_ids=[...]",
    "max_length": "max_new_tokens",
    "num_labels": "num_classes",
    "id2label": "labels= at export",
}


def check_hf_names(kwargs: dict[str, Any]) -> None:
    """`ValueError` naming our argument for any of Hugging Face's names in `kwargs`."""
    for old, new in HF_NAMES.items():
        if old in kwargs:
            raise ValueError(
                f"`{old}` is Hugging Face's name; here pass {new}. Received: {old}={kwargs[old]!r}"
            )


def check_known(kwargs: dict[str, Any], known: Collection[str], what: str) -> None:
    """`ValueError` listing the accepted names when `kwargs` has others."""
    check_hf_names(kwargs)
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"{what} does not take {unknown}; it takes {sorted(known)}")
