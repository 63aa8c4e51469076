"""A Hugging Face `tokenizer.json` (BPE or Unigram model) read into what our tokenizers run.

Supported, as `tokenizers` defines them: normalizers `NFC`, `NFD`, `NFKC`, `NFKD`,
`Precompiled` (SentencePiece's charsmap), `Lowercase`, `Prepend`, `Replace` and `Sequence`;
pre-tokenizers `ByteLevel`, `Split` (isolated matches), `Digits`, `Metaspace` and `Sequence`;
decoders `ByteLevel`, `Metaspace` and the `Replace`/`ByteFallback`/`Fuse`/`Strip` sequence of
Llama 2. Anything else raises a `ValueError` that names it, rather than tokenizing differently.
"""

import base64
import binascii
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.tokenizers import bpe_ops
from keras_attn.tokenizers.precompiled import precompiled_normalizer

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@dataclasses.dataclass
class Plan:
    kind: str  # the model: "BPE" or "Unigram"
    vocabulary: dict[str, int]
    merges: list[tuple[str, str]]
    scores: list[float]  # Unigram's piece scores
    added: dict[str, int]
    added_specs: list[dict[str, Any]]
    special_tokens: list[str]
    tokens: list[str]
    decoded: list[bytes]
    decoded_first: list[bytes]  # as the first token of a text (Metaspace drops its marks)
    normalizers: list[Callable[[tf.Tensor], tf.Tensor]]
    steps: list[Callable[[tf.Tensor, tf.Tensor], tf.RaggedTensor]]
    byte_level: bool = False
    byte_fallback: bool = False
    fuse_unk: bool = False
    ignore_merges: bool = False
    unknown_token: str | None = None
    unknown_id: int | None = None
    strip_leading_space: bool = False
    strip_added: bool = False
    added_pattern: str | None = None  # RE2 alternation of the added tokens, built once

    def normalize(self, texts: tf.Tensor) -> tf.Tensor:
        for normalizer in self.normalizers:
            texts = normalizer(texts)
        return texts

    def pre_tokenize(self, texts: tf.Tensor, first: tf.Tensor) -> tf.RaggedTensor:
        """`(n,)` texts to ragged `(n, words)`; `first`: the text starts its input line."""
        words = tf.RaggedTensor.from_tensor(texts[:, tf.newaxis])
        for step in self.steps:
            pieces = step(words.flat_values, tf.gather(first, words.value_rowids()))
            words = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)
        return words


def _unsupported(kind, spec):
    name = spec.get("type") if isinstance(spec, dict) else spec
    return ValueError(
        f"tokenizer.json's {kind} {name!r} is not supported here (we read the settings of "
        f"GPT-2, RoBERTa, Llama 2/3, Mistral, Qwen2 and Unigram models). Received: {spec!r}"[:400]
    )


def _literal_or_regex(pattern, kind):
    if "String" in pattern:
        return bpe_ops._re2_literal(pattern["String"]), "none"
    if "Regex" in pattern:
        translated = bpe_ops.re2_pattern(pattern["Regex"])
        check_regex(translated[0], pattern["Regex"], kind)
        return translated
    raise _unsupported(kind, pattern)


def check_regex(re2: str, original: str, kind: str) -> None:
    """Compiles `re2` with the engine that will run it, at load: an invalid pattern is a
    `ValueError` naming it, not a graph error at the first text."""
    with tf.init_scope():
        try:
            tf.strings.regex_full_match("", re2)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
            found = re.search(r"error: (.*?)(?: \[Op:|$)", error.message)
            reason = found.group(1) if found else "RE2 refuses it"
            raise ValueError(
                f"tokenizer.json's {kind} {original!r} is not a valid regex ({reason})"[:400]
            ) from None


def _normalizers(spec):
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        return [n for item in spec["normalizers"] for n in _normalizers(item)]
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return [lambda s, form=kind: tf_text.normalize_utf8(s, form)]
    if kind == "Lowercase":
        return [lambda s: tf.strings.lower(s, encoding="utf-8")]
    if kind == "Prepend":
        prefix = spec["prepend"]
        return [lambda s: tf.where(tf.strings.length(s) > 0, prefix + s, s)]
    if kind == "Precompiled":  # SentencePiece's charsmap (T5, ALBERT, XLM-R)
        charsmap = _base64(spec.get("precompiled_charsmap"))
        return [precompiled_normalizer(charsmap)] if charsmap else []
    if kind == "Replace" and "String" in spec["pattern"]:
        old, new = spec["pattern"]["String"], spec["content"]
        return [lambda s: bpe_ops.replace_literal(s, old, new)]
    raise _unsupported("normalizer", spec)


def _base64(text):
    try:
        return base64.b64decode(text or "", validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ValueError("tokenizer.json's Precompiled charsmap is not base64") from None


def _steps(spec, plan_flags):
    """Pre-tokenizer steps `(pieces, first) -> ragged pieces`; sets `byte_level`."""
    if spec is None:
        return []
    kind = spec.get("type")
    if plan_flags.get("byte_level"):
        raise _unsupported("pre-tokenizer after ByteLevel", spec)
    if kind == "Sequence":
        items = spec["pretokenizers"]
        # Metaspace after whitespace splitting (T5's) marks each word; after anything else
        # its "first" piece would differ from the one `tokenizers` sees.
        kinds = [item.get("type") for item in items]
        if "Metaspace" in kinds and kinds not in (["Metaspace"], ["WhitespaceSplit", "Metaspace"]):
            raise _unsupported("pre-tokenizer Metaspace in a sequence", spec)
        return [step for item in items for step in _steps(item, plan_flags)]
    if kind == "WhitespaceSplit":  # Rust's char::is_whitespace (Unicode White_Space), removed
        return [_whitespace_split]
    if kind == "ByteLevel":
        plan_flags["byte_level"] = True
        steps = []
        if spec.get("add_prefix_space"):
            steps.append(lambda s, first: tf.RaggedTensor.from_tensor(
                tf.where(_starts_with(s, " "), s, " " + s)[:, tf.newaxis]
            ))  # fmt: skip
        if spec.get("use_regex", True):
            regex, cut = bpe_ops.re2_pattern(GPT2_SPLIT)
            steps.append(lambda s, first: bpe_ops.split_words(s, regex, cut))
        return steps
    if kind == "Split":
        if spec.get("behavior") != "Isolated" or spec.get("invert"):
            raise _unsupported("pre-tokenizer Split behavior", spec)
        regex, cut = _literal_or_regex(spec["pattern"], "pre-tokenizer Split pattern")
        return [lambda s, first: bpe_ops.split_words(s, regex, cut)]
    if kind == "Digits":
        regex = r"\p{N}" if spec.get("individual_digits") else r"\p{N}+"
        return [lambda s, first: bpe_ops.regex_pieces(s, regex)]
    if kind == "Metaspace":
        return [_metaspace(spec)]
    raise _unsupported("pre-tokenizer", spec)


def _whitespace_split(pieces: tf.Tensor, first: tf.Tensor) -> tf.RaggedTensor:
    """The words between whitespace runs (NUL-safe: tensorflow-text's split stops at one)."""
    parts = bpe_ops.regex_pieces(pieces, bpe_ops.WHITESPACE_RUN)
    space = tf.strings.regex_full_match(parts.flat_values, bpe_ops.WHITESPACE_RUN)
    return tf.ragged.boolean_mask(parts, parts.with_flat_values(~space))


def _starts_with(strings, prefix):
    size = len(prefix.encode("utf-8"))
    return tf.strings.substr(strings, 0, size) == prefix


def _prepend_scheme(spec):
    return spec.get("prepend_scheme") or ("always" if spec.get("add_prefix_space") else "never")


def _metaspace(spec):
    mark, scheme, split = spec["replacement"], _prepend_scheme(spec), spec.get("split", True)

    def step(pieces: tf.Tensor, first: tf.Tensor) -> tf.RaggedTensor:
        pieces = bpe_ops.replace_literal(pieces, " ", mark)
        if scheme != "never":
            wanted = ~_starts_with(pieces, mark)
            if scheme == "first":
                wanted &= first
            pieces = tf.where(wanted, mark + pieces, pieces)
        if split:
            return bpe_ops.split_metaspace(pieces, mark)
        return tf.RaggedTensor.from_tensor(pieces[:, tf.newaxis])

    return step


def _decoder(spec, tokens):
    """The bytes each token decodes to, as the first token of a text and elsewhere, and
    whether the first space of the text goes."""
    kind = (spec or {}).get("type")
    if spec is None:
        plain = [t.encode("utf-8") for t in tokens]
        return plain, plain, False
    if kind == "ByteLevel":
        inverse = {c: b for b, c in enumerate(bpe_ops.byte_alphabet())}
        decoded = [
            bytes(inverse[c] for c in t) if all(c in inverse for c in t) else t.encode("utf-8")
            for t in tokens
        ]
        return decoded, decoded, False
    if kind == "Metaspace":
        # As `tokenizers` does: every mark of the first token goes, not only a leading one.
        mark = spec["replacement"]
        decoded = [t.replace(mark, " ").encode("utf-8") for t in tokens]
        if _prepend_scheme(spec) == "never":
            return decoded, decoded, False
        return decoded, [t.replace(mark, "").encode("utf-8") for t in tokens], False
    if kind != "Sequence":
        raise _unsupported("decoder", spec)
    replaces, fallback, strip = [], False, False
    for item in spec["decoders"]:
        if item.get("type") == "Replace" and "String" in item["pattern"]:
            replaces.append((item["pattern"]["String"], item["content"]))
        elif item.get("type") == "ByteFallback":
            fallback = True
        elif item.get("type") == "Fuse":
            pass
        elif item.get("type") == "Strip" and item.get("content") == " " and not item["stop"]:
            strip = item["start"] == 1
        else:
            raise _unsupported("decoder", item)
    decoded = []
    for token in tokens:
        if fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            decoded.append(bytes([int(token[3:5], 16)]))
            continue
        for old, new in replaces:
            token = token.replace(old, new)
        decoded.append(token.encode("utf-8"))
    return decoded, decoded, strip


def added_token_pattern(specs: list[dict[str, Any]]) -> str:
    """RE2 alternation of the added tokens, longest first, with the whitespace each strips."""
    space = f"[{bpe_ops.WHITESPACE}]*"
    parts = []
    for spec in sorted(specs, key=lambda s: -len(s["content"])):
        literal = bpe_ops._re2_literal(spec["content"])
        parts.append((space if spec.get("lstrip") else "") + literal
                     + (space if spec.get("rstrip") else ""))  # fmt: skip
    return "|".join(parts)


def serde_float(text: str) -> float:
    """A JSON number as `tokenizers` reads it: serde_json's default parser takes the digits as
    an integer, rounds it to float64, then multiplies or divides by a power of ten (two
    roundings, so now and then one unit in the last place off the exact decimal)."""
    negative = text.startswith("-")
    mantissa, _, exponent = text.lstrip("-").lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    power = (int(exponent) if exponent else 0) - len(fraction)
    digits = int(whole + fraction)
    if digits >= 2**64:  # not in the vocabularies we read: the exact value instead
        return float(text)
    value = float(digits)
    value = value * float(f"1e{power}") if power >= 0 else value / float(f"1e{-power}")
    return -value if negative else value


def plan_of(spec: dict[str, Any]) -> Plan:
    """Reads a `tokenizer.json` dict; `ValueError` naming any part not supported."""
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise ValueError("`tokenizer.json` must be a JSON object with a `model` object.")
    model = spec["model"]
    kind = model.get("type", "BPE" if "merges" in model else None)
    scores: list[float] = []
    merges: list[Any] = []
    if kind == "BPE":
        for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(option):
                raise _unsupported(f"BPE option {option}", model[option])
        vocabulary = {str(t): int(i) for t, i in model["vocab"].items()}
        merges = [tuple(m.split(" ", 1) if isinstance(m, str) else m) for m in model["merges"]]
        if any(len(m) != 2 or " " in m[0] or " " in m[1] for m in merges):
            raise ValueError("tokenizer.json's merges must be pairs of tokens without spaces.")
        unknown = model.get("unk_token")
    elif kind == "Unigram":
        vocabulary = {str(piece): i for i, (piece, _) in enumerate(model["vocab"])}
        scores = [serde_float(repr(float(score))) for _, score in model["vocab"]]
        unk_id = model.get("unk_id")
        if unk_id is None:
            raise _unsupported("Unigram model without unk_id", model.get("unk_id"))
        unknown = model["vocab"][unk_id][0]
    else:
        raise _unsupported("model", kind)
    added_specs = list(spec.get("added_tokens") or [])
    for added in added_specs:
        if added.get("single_word"):
            raise _unsupported("added token option single_word", added["content"])
    added = {a["content"]: int(a["id"]) for a in added_specs}
    size = max([*vocabulary.values(), *added.values(), -1]) + 1
    tokens = [""] * size
    for token, index in [*vocabulary.items(), *added.items()]:
        tokens[index] = token
    flags: dict[str, Any] = {}
    steps = _steps(spec.get("pre_tokenizer"), flags)
    decoded, decoded_first, strip = _decoder(spec.get("decoder"), tokens)
    return Plan(
        kind=kind,
        vocabulary=vocabulary,
        merges=merges,
        scores=scores,
        added=added,
        added_specs=added_specs,
        special_tokens=[a["content"] for a in added_specs if a.get("special")],
        tokens=tokens,
        decoded=decoded,
        decoded_first=decoded_first,
        normalizers=_normalizers(spec.get("normalizer")),
        steps=steps,
        byte_level=bool(flags.get("byte_level")),
        byte_fallback=bool(model.get("byte_fallback")),
        fuse_unk=bool(model.get("fuse_unk")),
        ignore_merges=bool(model.get("ignore_merges")),
        unknown_token=unknown,
        unknown_id=vocabulary.get(unknown) if unknown is not None else None,
        strip_leading_space=strip,
        strip_added=any(a.get("lstrip") or a.get("rstrip") for a in added_specs),
        # Built here, in Python, never in traced code: autograph would convert its loop over
        # every added token (10,000 tokens took 52 s to trace).
        added_pattern=added_token_pattern(added_specs) if added else None,
    )
