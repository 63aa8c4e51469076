"""SentencePiece's `precompiled_charsmap` normalizer (T5, ALBERT, XLM-R, Marian), run in the
TensorFlow graph as `tokenizers`' `Precompiled` normalizer runs it.

The charsmap is a darts-clone double-array trie over UTF-8 keys, followed by the replacement
strings. `precompiled_normalizer` walks the trie in the graph (every offset bounds-checked, so
a malformed charsmap changes no memory outside it) with `tokenizers`' semantics:

- the text is cut into grapheme clusters;
- a cluster of several characters and under 6 bytes is replaced whole by the replacement of
  the shortest key that begins it, when one does (the rest of the cluster goes with it, as in
  `tokenizers`: "weird, but SentencePiece does this");
- otherwise each character is replaced by its own rule, or kept.

Grapheme clusters come from an RE2 pattern of Unicode's rules that can join characters into a
cluster of under 6 bytes (CR LF, Prepend, Extend, ZWJ, SpacingMark; Hangul syllables and
regional indicators never fit in 6 bytes); ids equal `tokenizers`' on every code point alone
and on a corpus of combining sequences (tested).
"""

import functools
import struct
import sys
import unicodedata
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

MAX_CHARSMAP_BYTES = 4 << 20  # T5's and XLM-R's are ~240 KB
MISSING = b"\xff"  # never a replacement: they are UTF-8

# Unicode's Grapheme_Cluster_Break classes that join characters, where `unicodedata` has no
# property for them: Prepend (UAX #29's list), the marks that are Extend although spacing,
# and the spacing marks that are neither.
PREPEND = "\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u0d4e\U000110bd\U000110cd\U000111c2\U000111c3\U0001193f\U00011941\U00011a3a\U00011a84-\U00011a89\U00011d46\U00011f02"  # noqa: E501
EXTEND_EXTRA = "\u200c\u200d\uff9e\uff9f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f"
NOT_SPACING = {0x102B, 0x102C, 0x1038, 0x1083, 0x108F, 0x1A61, 0x1A63, 0x1A64, 0xAA7B, 0xAA7D,
               0x11720, 0x11721, *range(0x1062, 0x1065), *range(0x1067, 0x106E),
               *range(0x1087, 0x108D), *range(0x109A, 0x109D)}  # fmt: skip


def read_charsmap(charsmap: bytes) -> tuple[np.ndarray, bytes]:
    """The trie's units and the replacement strings of a `precompiled_charsmap`.

    Raises:
        ValueError: when its size or its trie's size does not fit (offsets inside are checked
            where they are followed, in the graph).
    """
    if not isinstance(charsmap, bytes) or not 8 <= len(charsmap) <= MAX_CHARSMAP_BYTES:
        raise ValueError(
            f"`precompiled_charsmap` must be 8 to {MAX_CHARSMAP_BYTES} bytes. Received: "
            f"{len(charsmap) if isinstance(charsmap, bytes) else type(charsmap).__name__}"
        )
    (trie_bytes,) = struct.unpack_from("<I", charsmap)
    if trie_bytes % 4 or not 4 <= trie_bytes <= len(charsmap) - 4:
        raise ValueError(f"`precompiled_charsmap`'s trie size {trie_bytes} does not fit its data")
    units = np.frombuffer(charsmap, "<u4", trie_bytes // 4, 4).astype(np.int64)
    strings = charsmap[4 + trie_bytes :]
    try:
        strings.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("`precompiled_charsmap`'s replacements are not UTF-8") from None
    return units, strings


def _ranges(codes: list[int]) -> str:
    """An RE2 character-class body for sorted code points."""
    parts, start = [], None
    for i, code in enumerate(codes):
        if start is None:
            start = code
        if i + 1 == len(codes) or codes[i + 1] != code + 1:
            parts.append(f"\\x{{{start:x}}}" + (f"-\\x{{{code:x}}}" if code != start else ""))
            start = None
    return "".join(parts)


@functools.cache
def grapheme_pattern() -> str:
    """An RE2 pattern matching one grapheme cluster, as far as clusters under 6 bytes go."""
    extend, control = [], []
    for code in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(code))
        if category in ("Mn", "Me") or (category == "Mc" and code not in NOT_SPACING):
            extend.append(code)
        elif category in ("Cc", "Zl", "Zp") or (category == "Cf" and code not in (0x200C, 0x200D)):
            control.append(code)
    extend_class = _ranges(extend) + EXTEND_EXTRA + "\u0e33\u0eb3"
    prepend = _expand(PREPEND)
    control_class = _ranges([c for c in control if chr(c) not in prepend])
    return f"\r\n|[{control_class}]|[{PREPEND}]*[^{control_class}][{extend_class}]*|[{PREPEND}]+"


def _expand(char_class: str) -> set[str]:
    chars: set[str] = set()
    i = 0
    while i < len(char_class):
        if i + 2 < len(char_class) and char_class[i + 1] == "-":
            chars.update(chr(c) for c in range(ord(char_class[i]), ord(char_class[i + 2]) + 1))
            i += 3
        else:
            chars.add(char_class[i])
            i += 1
    return chars


def precompiled_normalizer(charsmap: bytes) -> Callable[[tf.Tensor], tf.Tensor]:
    """`(n,)` strings → `(n,)` strings normalized by the charsmap's rules (see module)."""
    from keras_attn.tokenizers import bpe_ops

    units_np, strings = read_charsmap(charsmap)
    data = np.frombuffer(strings, np.uint8)
    # The replacements, NUL-separated: each as one string, and where each starts. A leaf
    # pointing into the middle of a character (no real charsmap has one) finds nothing.
    starts_np = np.concatenate([[0], np.flatnonzero(data == 0) + 1])
    boundary_np = np.append((data & 0xC0) != 0x80, False)
    with tf.init_scope():
        units = tf.constant(units_np)
        pieces_table = tf.constant(strings.split(b"\0"))
        starts = tf.constant(starts_np, tf.int64)
        boundary = tf.constant(boundary_np)
        pattern = grapheme_pattern()
    root = _offset(units_np[0])

    def lookup(pieces: tf.Tensor, width: int) -> tf.Tensor:
        """The replacement of the shortest key that begins each piece (`MISSING` if none),
        walking the trie over the first `width` bytes as `common_prefix_search` does."""
        codes = tf.ragged.map_flat_values(_byte_values, tf.strings.bytes_split(pieces)).to_tensor(
            0, shape=tf.stack([tf.size(pieces, out_type=tf.int64), width])
        )
        position = tf.fill(tf.shape(pieces), tf.constant(root, tf.int64))
        alive = tf.ones(tf.shape(pieces), tf.bool)
        found = tf.fill(tf.shape(pieces), tf.constant(-1, tf.int64))
        size = tf.size(units, out_type=tf.int64)
        for i in range(width):
            byte = codes[:, i]
            child = tf.bitwise.bitwise_xor(position, byte)
            alive &= (byte != 0) & (child < size)
            unit = tf.gather(units, tf.where(alive, child, 0))
            alive &= tf.bitwise.bitwise_and(unit, (1 << 31) | 0xFF) == byte
            position = tf.bitwise.bitwise_xor(child, _offset(unit))
            alive &= position < size
            leaf = tf.gather(units, tf.where(alive, position, 0))
            hit = alive & (tf.bitwise.bitwise_and(unit, 1 << 8) != 0) & (found < 0)
            found = tf.where(hit, tf.bitwise.bitwise_and(leaf, (1 << 31) - 1), found)
        found = tf.where(found < tf.size(boundary, out_type=tf.int64) - 1, found, -1)
        found = tf.where(tf.gather(boundary, tf.maximum(found, 0)), found, -1)
        start = tf.maximum(found, 0)
        which = tf.searchsorted(starts, start, side="right") - 1
        piece = tf.gather(pieces_table, which)
        offset = tf.cast(start - tf.gather(starts, which), tf.int32)
        text = tf.strings.substr(piece, offset, tf.strings.length(piece) - offset)
        return tf.where(found >= 0, text, MISSING)

    def normalize(texts: tf.Tensor) -> tf.Tensor:
        clusters = bpe_ops.regex_pieces(texts, pattern)  # NUL and U+0001: both Control
        flat = clusters.flat_values
        chars = tf.strings.unicode_split(flat, "UTF-8", errors="replace")
        joined = (chars.row_lengths() > 1) & (tf.strings.length(flat) < 6)
        whole = lookup(tf.where(joined, flat, ""), 5)
        each = lookup(chars.flat_values, 4)
        each = tf.strings.reduce_join(
            chars.with_flat_values(tf.where(each == MISSING, chars.flat_values, each)), axis=1
        )
        out = clusters.with_flat_values(tf.where(whole == MISSING, each, whole))
        return tf.strings.reduce_join(out, axis=1)

    return normalize


def _byte_values(chars: tf.Tensor) -> tf.Tensor:
    """`(n,)` one-byte strings → `(n,)` int64 byte values (n may be 0)."""
    return tf.cast(tf.reshape(tf.io.decode_raw(chars, tf.uint8, fixed_length=1), [-1]), tf.int64)


def _offset(unit: Any) -> Any:
    """darts-clone's offset of a unit (NumPy or TensorFlow integers)."""
    if isinstance(unit, tf.Tensor):
        shift = tf.bitwise.right_shift(tf.bitwise.bitwise_and(unit, 1 << 9), 6)
        return tf.bitwise.left_shift(tf.bitwise.right_shift(unit, 10), shift)
    return (int(unit) >> 10) << ((int(unit) & (1 << 9)) >> 6)
