"""Byte-pair encoding as TensorFlow graph ops: pre-tokenizing regexes, the byte alphabet, merges.

What `BytePairTokenizer` runs. Every function maps string tensors to string tensors (dense or
ragged), so they work in `tf.data` and in SavedModel graphs, under any Keras backend.

Hugging Face `tokenizers` writes its pre-tokenizing patterns for Oniguruma, whose `\\s` is
Unicode whitespace and which has lookahead; TensorFlow's regexes are RE2 (ASCII `\\s`, no
lookahead). `re2_pattern` translates one, and `split_words` reproduces the one lookahead every
GPT-2-style pattern ends with (`\\s+(?!\\S)`: a whitespace run gives its last character to the
word after it) by cutting the text before that character first.
"""

import tensorflow as tf
import tensorflow_text as tf_text

# Unicode White_Space: what `\s` means to Oniguruma (RE2's `\s` is [\t\n\f\r ]).
WHITESPACE = (
    r"\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}"
    r"\x{3000}"
)
WHITESPACE_RUN = f"[{WHITESPACE}]+"
LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"
NEWLINE_RUN = r"\s*[\r\n]+"  # patterns with this alternative keep a run's last newline
NO_RANK = 2**31 - 1


def byte_alphabet() -> list[str]:
    """The character each byte is written as in byte-level BPE (GPT-2's table).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes, in byte order, take the
    characters from U+0100 on, so that no token holds whitespace or control characters.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def re2_pattern(pattern: str) -> tuple[str, str]:
    """A `tokenizers` pre-tokenizing pattern as RE2, and how `split_words` must cut first.

    Returns `(re2, cut)`: `cut` is `"none"` (no lookahead), `"last"` (GPT-2's tail) or
    `"last_unless_newline"` (Llama 3's and Qwen2's, whose `\\s*[\\r\\n]+` alternative takes a
    run that ends in a newline whole). Other lookaround raises a `ValueError`.
    """
    cut = "none"
    head = pattern
    if pattern.endswith(LOOKAHEAD_TAIL):
        head = pattern[: -len(LOOKAHEAD_TAIL)]
        cut = "last_unless_newline" if NEWLINE_RUN in head else "last"
    if any(look in head for look in ("(?=", "(?!", "(?<")):
        raise ValueError(
            "`pattern` uses lookaround, which only the GPT-2 ending `\\s+(?!\\S)|\\s+` may "
            f"here. Received: pattern={pattern!r}"
        )
    translated = _translate_whitespace(head)
    return (translated + f"|{WHITESPACE_RUN}" if cut != "none" else translated), cut


def _translate_whitespace(pattern):
    """`\\s` and `\\S` written as Unicode whitespace classes for RE2."""
    out, index, in_class = [], 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            escaped = pattern[index + 1]
            if escaped == "s":
                out.append(WHITESPACE if in_class else f"[{WHITESPACE}]")
            elif escaped == "S" and not in_class:
                out.append(f"[^{WHITESPACE}]")
            elif escaped == "S":
                raise ValueError(f"`pattern` has \\S inside a class. Received: {pattern!r}")
            else:
                out.append(pattern[index : index + 2])
            index += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        index += 1
    return "".join(out)


def regex_pieces(strings: tf.Tensor, pattern: str) -> tf.RaggedTensor:
    """`(n,)` strings to ragged `(n, pieces)`: the matches of `pattern` (RE2) and the text
    between them, in order, as `tf_text.regex_split` keeping its delimiters, except that a NUL
    character does not end the text (tensorflow-text's op stops at one; here matching runs on
    a copy with U+0001, of the same character class to every pattern, and the pieces are cut
    from the original)."""
    safe = tf.strings.regex_replace(strings, r"\x00", "\x01")
    _, starts, ends = tf_text.regex_split_with_offsets(safe, pattern, pattern)
    return starts.with_flat_values(
        tf.strings.substr(
            tf.gather(strings, starts.value_rowids()),
            starts.flat_values,
            ends.flat_values - starts.flat_values,
        )
    )


def split_words(strings: tf.Tensor, pattern: str, cut: str) -> tf.RaggedTensor:
    """`(n,)` strings to ragged `(n, words)`: the matches of `pattern` (RE2, from
    `re2_pattern`), with the lookahead the original pattern had when `cut` says so."""
    if cut == "none":
        return regex_pieces(strings, pattern)
    pieces, _, ends = tf_text.regex_split_with_offsets(
        tf.strings.regex_replace(strings, r"\x00", "\x01"), WHITESPACE_RUN, WHITESPACE_RUN
    )
    flat = pieces.flat_values
    rows = pieces.value_rowids()
    # A whitespace run of two characters or more, followed by a non-space piece, ends one
    # character early: its last character starts the next word.
    last = tf.maximum(tf.strings.length(flat, unit="UTF8_CHAR") - 1, 0)
    last_char = tf.strings.substr(flat, last, tf.ones_like(last), unit="UTF8_CHAR")
    followed = (
        tf.range(tf.size(flat, out_type=tf.int64)) < tf.gather(pieces.row_splits, rows + 1) - 1
    )
    cuts = (
        tf.strings.regex_full_match(flat, WHITESPACE_RUN)
        & followed
        & (tf.strings.length(flat, unit="UTF8_CHAR") >= 2)
    )
    if cut == "last_unless_newline":
        cuts &= ~tf.strings.regex_full_match(last_char, r"[\r\n]")
    positions = ends.flat_values - tf.cast(tf.strings.length(last_char), tf.int64)
    cut_at = tf.RaggedTensor.from_value_rowids(
        tf.boolean_mask(positions, cuts),
        tf.boolean_mask(rows, cuts),
        nrows=tf.size(strings, tf.int64),
    )
    total = tf.cast(tf.strings.length(strings), tf.int64)[:, tf.newaxis]
    bounds = tf.concat([tf.zeros_like(total), cut_at, total], axis=1)
    starts, stops = bounds[:, :-1], bounds[:, 1:]
    parts = tf.strings.substr(
        tf.gather(strings, starts.value_rowids()),
        starts.flat_values,
        stops.flat_values - starts.flat_values,
    )
    words = regex_pieces(parts, pattern)
    return tf.RaggedTensor.from_row_splits(words, starts.row_splits).merge_dims(1, 2)


def split_metaspace(strings: tf.Tensor, replacement: str) -> tf.RaggedTensor:
    """`(n,)` strings to ragged words, each starting at a `replacement` character."""
    escaped = _re2_literal(replacement)
    return regex_pieces(strings, f"{escaped}[^{escaped}]*")


def _re2_literal(text):
    return "".join(f"\\x{{{ord(c):X}}}" for c in text)


def replace_literal(strings: tf.Tensor, old: str, new: str) -> tf.Tensor:
    return tf.strings.regex_replace(strings, _re2_literal(old), new.replace("\\", "\\\\"))


def merge_pairs(symbols: tf.RaggedTensor, ranks: tf.lookup.StaticHashTable) -> tf.RaggedTensor:
    """Applies BPE merges to ragged `(words, symbols)` strings until none applies.

    Each step merges, in every word, every occurrence of that word's lowest-ranked adjacent
    pair, left to right without overlap (`a a a` → `aa a`), as GPT-2's reference and the
    `tokenizers` library do. `ranks` maps `"left right"` to the merge's rank.
    """

    def step(values: tf.Tensor, splits: tf.Tensor, _: tf.Tensor) -> tuple:
        words = tf.RaggedTensor.from_row_splits(values, splits, validate=False)
        left, right = words[:, :-1], words[:, 1:]
        pair_ranks = ranks.lookup(
            tf.strings.join([left.flat_values, right.flat_values], separator=" ")
        )
        pair_ranks = tf.RaggedTensor.from_row_splits(pair_ranks, left.row_splits, validate=False)
        best = tf.reduce_min(pair_ranks, axis=1)
        pair_rows = pair_ranks.value_rowids()
        match = (pair_ranks.flat_values == tf.gather(best, pair_rows)) & (
            pair_ranks.flat_values < NO_RANK
        )
        # Runs of matches only come from a repeated symbol (`a a a`): merge every other one.
        index = tf.range(tf.size(match, out_type=tf.int64))
        first_in_row = index == tf.gather(left.row_splits, pair_rows)
        previous = tf.concat([[False], match[:-1]], axis=0) & ~first_in_row
        starts = match & ~previous
        run = tf.cumsum(tf.cast(starts, tf.int64)) - 1
        start_at = tf.concat([tf.reshape(tf.where(starts), [-1]), [0]], axis=0)  # [0]: none
        run_start = tf.gather(start_at, tf.maximum(run, 0))
        merge = match & ((index - run_start) % 2 == 0)
        # Pair p of row r sits on symbols p and p + 1 of the flat symbol list.
        at = index - tf.gather(left.row_splits, pair_rows) + tf.gather(splits, pair_rows)
        size = tf.size(values, out_type=tf.int64)[tf.newaxis]
        merged = tf.scatter_nd(tf.boolean_mask(at, merge)[:, tf.newaxis],
                               tf.ones_like(tf.boolean_mask(at, merge)), size) > 0  # fmt: skip
        consumed = tf.scatter_nd(tf.boolean_mask(at + 1, merge)[:, tf.newaxis],
                                 tf.ones_like(tf.boolean_mask(at, merge)), size) > 0  # fmt: skip
        following = tf.concat([values, [""]], axis=0)[1:]  # one longer: safe when empty
        values = tf.where(merged, tf.strings.join([values, following]), values)
        kept = tf.ragged.boolean_mask(
            tf.RaggedTensor.from_row_splits(values, splits, validate=False),
            tf.RaggedTensor.from_row_splits(~consumed, splits, validate=False),
        )
        return kept.flat_values, kept.row_splits, tf.reduce_any(merge)

    values, splits, _ = tf.while_loop(
        lambda values, splits, more: more,
        step,
        (symbols.flat_values, symbols.row_splits, tf.constant(True)),
        shape_invariants=(tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([])),
    )
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False)
