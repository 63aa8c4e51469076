"""The Hugging Face folder layout on disk: `config.json`, `model.safetensors` (one file or an
index of shards), `vocab.txt` / `tokenizer.json`, and sentence-transformers' pooling config.

Only safetensors are read: `pytorch_model.bin` is a pickle, and loading a pickle runs code.
"""

import json
import os
import re
from typing import Any

import numpy as np

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
VOCABULARY_FILE = "vocab.txt"
PICKLED_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5")


def _path(folder, name):
    return os.path.join(os.fspath(folder), name)


def _read_json(folder, name, argument="folder"):
    try:
        with open(_path(folder, name), encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise ValueError(
            f"`{argument}` has no {name}. Received: {argument}={os.fspath(folder)!r}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{name} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must hold a JSON object. Received: {type(value).__name__}")
    return value


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """`config.json` of a Hugging Face model folder, as a dict."""
    if not os.path.isdir(os.fspath(folder)):
        raise ValueError(
            f"`folder` must be a model folder (config.json, model.safetensors). "
            f"Received: folder={os.fspath(folder)!r}"
        )
    return _read_json(folder, CONFIG_FILE)


GENERATION_FILE = "generation_config.json"
# The generation settings a layout reads: from `generation_config.json` where the folder has
# one, else from `config.json` (older folders), as `transformers` 5 reads them.
GENERATION_KEYS = ("bad_words_ids", "forced_eos_token_id", "forced_bos_token_id")


def with_generation_defaults(folder: str | os.PathLike[str], config: dict[str, Any]) -> dict:
    """`config` whose `GENERATION_KEYS` are those of the folder's `generation_config.json`
    where there is one (a key it does not hold is None there, whatever `config.json` says:
    `transformers` then reads only that file); `config` as it is otherwise, but for the older
    BART flag `force_bos_token_to_be_generated`, which `transformers` reads there as
    `forced_bos_token_id = bos_token_id`."""
    if not os.path.exists(_path(folder, GENERATION_FILE)):
        if config.get("force_bos_token_to_be_generated"):
            # Older BART folders: `transformers` then forces the config's `bos_token_id`
            # (BartConfig's default 0; Marian's None), whatever `forced_bos_token_id` says.
            bos = config.get("bos_token_id", 0 if config.get("model_type") == "bart" else None)
            return {**config, "forced_bos_token_id": bos}
        return config
    generation = _read_json(folder, GENERATION_FILE)
    if not isinstance(generation, dict):
        raise ValueError(f"{GENERATION_FILE} must hold a JSON object")
    extra = {k: generation.get(k) for k in GENERATION_KEYS}
    return {**config, **extra}


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _weight_files(folder):
    """The safetensors files holding the folder's weights: one, or the shards of its index."""
    if os.path.exists(_path(folder, WEIGHTS_FILE)):
        return [WEIGHTS_FILE]
    if os.path.exists(_path(folder, WEIGHTS_INDEX_FILE)):
        index = _read_json(folder, WEIGHTS_INDEX_FILE)
        weight_map = index.get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise ValueError(f"{WEIGHTS_INDEX_FILE}'s weight_map must map keys to file names.")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if os.path.basename(shard) != shard:
                raise ValueError(
                    f"{WEIGHTS_INDEX_FILE} names a shard outside the folder: {shard!r}"
                )
        return shards
    pickled = [name for name in PICKLED_FILES if os.path.exists(_path(folder, name))]
    if pickled:
        raise ValueError(
            f"The folder holds {pickled[0]}, a pickled checkpoint, which is never loaded here "
            "(unpickling runs code). Convert it to model.safetensors first, e.g. with "
            "`transformers`: model.save_pretrained(folder, safe_serialization=True)."
        )
    raise ValueError(f"`folder` has no {WEIGHTS_FILE}. Received: folder={os.fspath(folder)!r}")


def read_safetensors(path: str | os.PathLike[str], header_only: bool = False) -> dict[str, Any]:
    """The tensors of one safetensors file as NumPy arrays, or with `header_only` their
    `(dtype, shape)` read from the header alone (nothing allocated).

    Raises:
        ValueError: naming the file, when it is missing, truncated, or not safetensors.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    name = os.path.basename(os.fspath(path))
    try:
        if not header_only:
            return load_file(os.fspath(path))
        with safe_open(os.fspath(path), framework="np") as f:
            return {
                key: (f.get_slice(key).get_dtype(), tuple(f.get_slice(key).get_shape()))
                for key in f.keys()
            }
    except FileNotFoundError:
        raise ValueError(f"{name} is missing from the folder.") from None
    except Exception as error:  # SafetensorError, or an OSError from a file cut short
        raise ValueError(f"{name} is not a valid safetensors file: {error}") from None


def read_header(folder: str | os.PathLike[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's `(dtype, shape)` in the folder's weights, from the headers alone."""
    header = {}
    for name in _weight_files(folder):
        header.update(read_safetensors(_path(folder, name), header_only=True))
    return header


def read_weights(folder: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of `model.safetensors` (or of the shards its index lists), as NumPy."""
    weights = {}
    for name in _weight_files(folder):
        weights.update(read_safetensors(_path(folder, name)))
    return weights


def write_folder(
    folder: str | os.PathLike[str],
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    vocabulary: list[str] | None = None,
    extra_json: dict[str, Any] | None = None,
    max_shard_size: int | None = None,
) -> None:
    """Writes `config.json`, `model.safetensors` (and `vocab.txt`, and other JSON files given
    as `{relative path: object}`), creating the folder. With `max_shard_size` (bytes) the
    tensors are split, whole, over `model-00001-of-0000n.safetensors` … and listed in
    `model.safetensors.index.json`."""
    from safetensors.numpy import save_file

    check_shard_size(max_shard_size)
    os.makedirs(os.fspath(folder), exist_ok=True)
    with open(_path(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True, allow_nan=False)
    arrays = {key: np.ascontiguousarray(value) for key, value in weights.items()}
    shards = _shards(arrays, max_shard_size)
    # A rewrite leaves neither the other form nor shards of an earlier split (which a reader
    # globbing `*.safetensors` would mix in), as `transformers` cleans them.
    stale = [WEIGHTS_FILE, WEIGHTS_INDEX_FILE]
    stale += [name for name in os.listdir(os.fspath(folder)) if SHARD_NAME.fullmatch(name)]
    for name in stale:
        if os.path.isfile(_path(folder, name)):
            os.remove(_path(folder, name))
    if len(shards) == 1:
        save_file(arrays, _path(folder, WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for number, keys in enumerate(shards, 1):
            name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: arrays[k] for k in keys}, _path(folder, name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(keys, name))
        total = sum(a.nbytes for a in arrays.values())
        with open(_path(folder, WEIGHTS_INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if vocabulary is not None:
        with open(_path(folder, VOCABULARY_FILE), "w", encoding="utf-8") as f:
            f.write("\n".join(vocabulary) + "\n")
    for name, value in (extra_json or {}).items():
        os.makedirs(os.path.dirname(_path(folder, name)), exist_ok=True)
        with open(_path(folder, name), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, allow_nan=False)


def check_shard_size(max_shard_size: Any) -> None:
    if max_shard_size is not None and (
        isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int)
        or max_shard_size <= 0
    ):  # fmt: skip
        raise ValueError(
            "`max_shard_size` must be a positive number of bytes. "
            f"Received: max_shard_size={max_shard_size!r}"
        )


def _shards(arrays: dict[str, np.ndarray], max_bytes: int | None) -> list[list[str]]:
    """Keys grouped in order into shards of at most `max_bytes` (a larger tensor alone)."""
    if max_bytes is None:
        return [list(arrays)]
    shards: list[list[str]] = [[]]
    size = 0
    for key, array in arrays.items():
        if shards[-1] and size + array.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += array.nbytes
    return shards


def read_vocabulary(folder: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """`(tokens, lowercase)` of a WordPiece folder: `vocab.txt`, or the vocabulary inside
    `tokenizer.json`; `lowercase` from `tokenizer_config.json` (`do_lower_case`, default True).
    """
    lowercase = True
    if os.path.exists(_path(folder, "tokenizer_config.json")):
        lowercase = bool(_read_json(folder, "tokenizer_config.json").get("do_lower_case", True))
    if os.path.exists(_path(folder, VOCABULARY_FILE)):
        with open(_path(folder, VOCABULARY_FILE), encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f], lowercase
    if os.path.exists(_path(folder, "tokenizer.json")):
        model = _read_json(folder, "tokenizer.json").get("model") or {}
        if model.get("type") != "WordPiece":
            raise ValueError(
                "tokenizer.json must describe a WordPiece model for `WordPieceTokenizer`. "
                f"Received: model type {model.get('type')!r}"
            )
        vocab: dict[str, int] = model.get("vocab") or {}
        tokens = sorted(vocab, key=vocab.get)  # type: ignore[arg-type]  # every key is in it
        if [vocab[t] for t in tokens] != list(range(len(tokens))):
            raise ValueError("tokenizer.json's vocabulary ids are not 0..n-1.")
        return tokens, lowercase
    raise ValueError(
        f"`folder` has neither {VOCABULARY_FILE} nor tokenizer.json. "
        f"Received: folder={os.fspath(folder)!r}"
    )


def read_pooling(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Sentence-transformers' pooling of a folder, from `modules.json` and the pooling module's
    `config.json`: `{"pooling": "mean" | "cls" | "max", "normalize": bool}`; `None` for a plain
    model folder."""
    if not os.path.exists(_path(folder, "modules.json")):
        return None
    with open(_path(folder, "modules.json"), encoding="utf-8") as f:
        modules = json.load(f)
    pooling, normalize = None, False
    for module in modules if isinstance(modules, list) else []:
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            path = str(module.get("path", ""))
            if os.path.basename(path) != path:
                raise ValueError(f"modules.json names a module outside the folder: {path!r}")
            config = _read_json(_path(folder, path), CONFIG_FILE)
            for mode in ("cls", "mean", "max"):
                if config.get(f"pooling_mode_{mode}_token") or config.get(
                    f"pooling_mode_{mode}_tokens"
                ):
                    pooling = mode
        elif kind.endswith(".Normalize"):
            normalize = True
    if pooling is None:
        return None
    return {"pooling": pooling, "normalize": normalize}
