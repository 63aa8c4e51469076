"""Builds `serving/wordpiece_unicode.json`: the code points on which the serving tokenizer (the
`tokenizers` library, older Unicode tables) and the in-graph one (tensorflow-text and RE2,
newer ones) split or clean text differently, and what the in-graph one does with each.

Each code point `c` is probed as the word `x{c}y` through both tokenizers (with the serving
tokenizer's table switched off). Where they differ, the in-graph ids say what `c` is there:
- `drop`: the same ids as `xy` (a control or format character, a combining mark stripped);
- `isolate`: the same ids as `x {c} y` (punctuation, a CJK character);
- `word`: anything else (a letter the serving tables split off); the serving tokenizer then
  writes a letter outside the vocabulary in its place, as the in-graph one gives `[UNK]`.

    python -m tests.tokenizers.unicode_table   # rewrites the file
"""

import json
import sys

from keras_attn_serving.tokenizer import UNICODE_TABLE_FILE, WORD_STANDIN

CHUNK = 50_000


def code_points(start=0x20, stop=0x110000):
    return [c for c in range(start, stop) if not 0xD800 <= c <= 0xDFFF]


def classify(ours, serving, points):
    """`{"drop": [...], "isolate": [...], "word": [...]}` for the points where they differ."""
    table = {"drop": [], "isolate": [], "word": []}
    nothing = ours.tokenize(["xy"]).to_list()[0]
    for start in range(0, len(points), CHUNK):
        chunk = points[start : start + CHUNK]
        probes = [f"x{chr(c)}y" for c in chunk]
        got = ours.tokenize(probes).to_list()
        served = serving.encode(probes)
        differ = [
            (c, ids) for c, ids, other in zip(chunk, got, served, strict=True) if ids != other
        ]
        if not differ:
            continue
        isolated = ours.tokenize([f"x {chr(c)} y" for c, _ in differ]).to_list()
        for (c, ids), alone in zip(differ, isolated, strict=True):
            kind = "drop" if ids == nothing else "isolate" if ids == alone else "word"
            table[kind].append(c)
    return table


def build(vocabulary, points=None):
    """The table for both normalizations (uncased: lower-casing and accent stripping)."""
    from keras_attn_serving.tokenizer import WordPieceTextTokenizer

    from keras_attn.tokenizers import WordPieceTokenizer

    out = {}
    for name, lowercase in (("uncased", True), ("cased", False)):
        ours = WordPieceTokenizer(vocabulary, lowercase=lowercase)
        serving = WordPieceTextTokenizer(
            vocabulary, lowercase=lowercase, special_tokens=ours.special_tokens, unicode_table={}
        )
        out[name] = classify(ours, serving, points or code_points())
    return out


def main():
    from keras_attn.data import checkpoint_folder
    from keras_attn.pretrained import read_vocabulary

    vocabulary, _ = read_vocabulary(checkpoint_folder())
    assert WORD_STANDIN not in vocabulary
    table = build(vocabulary)
    with open(UNICODE_TABLE_FILE, "w", encoding="utf-8") as f:
        json.dump(table, f, separators=(",", ":"))
        f.write("\n")
    sizes = {name: {k: len(v) for k, v in t.items()} for name, t in table.items()}
    print(f"wrote {UNICODE_TABLE_FILE}: {sizes}", file=sys.stderr)


if __name__ == "__main__":
    main()
