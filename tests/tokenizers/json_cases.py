"""Lines and `tokenizers`-trained vocabularies for the tokenizer.json differential tests.

Each case is the `tokenizer.json` settings of a model family users bring (GPT-2, RoBERTa,
Llama 3, Qwen2: byte-level BPE; Llama 2, Mistral: SentencePiece-style BPE with byte fallback;
T5-style Unigram), trained here by `tokenizers` on generated lines.
"""

import json
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from keras_attn.tokenizers.byte_pair import LLAMA3_PATTERN, QWEN2_PATTERN
from tests.tokenizers.test_differential import word

CODE = [
    "def f(x, y):\n    return x**2 + y  # square",
    "if (a && b) { return c[i]; }",
    "for i in range(10):\n\tprint(i)",
    '{"key": [1, 2.5e-3, null], "ok": true}',
    "SELECT * FROM t WHERE id <> 3;",
    "x += 1; y -= 2; z *= 3 // 4",
    "#include <stdio.h>\r\nint main() {}",
]
NUMBERS = ["3.14159", "1,234,567", "2026-11-24", "0x1F", "12345678901234", "-42", "1e10", "½"]
CONTRACTIONS = ["don't", "I'LL", "we'Re", "it's", "they've", "'s", "O'Neil's", "ſ'S", "'D"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u3000", "\xa0", " \t ", "\x0b"]
SPECIAL = ["<|endoftext|>", "<s>", "</s>"]


def mixed_lines(count: int, seed: int) -> list[str]:
    """Lines of random Unicode words, code, numbers, contractions and whitespace runs (with
    leading and trailing ones), and now and then a special token."""
    rng = random.Random(seed)

    def fragment():
        kind = rng.random()
        if kind < 0.45:
            return word(rng)
        if kind < 0.6:
            return rng.choice(CODE)
        if kind < 0.75:
            return rng.choice(NUMBERS)
        if kind < 0.9:
            return rng.choice(CONTRACTIONS)
        if kind < 0.95:
            return rng.choice(SPECIAL)
        return "".join(rng.choice("aAeE ") for _ in range(rng.randint(1, 30)))

    lines = []
    for _ in range(count):
        parts = [fragment() for _ in range(rng.randint(1, 8))]
        line = "".join(p + rng.choice(SPACES) for p in parts)
        lines.append(line if rng.random() < 0.3 else line.strip(" "))
    return lines


BYTES = [f"<0x{b:02X}>" for b in range(256)]
CASES = ["gpt2", "roberta", "llama3", "qwen2", "llama2", "mistral", "unigram"]


def _bpe(case):
    if case in ("llama2", "mistral"):
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if case == "llama2":
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
            )
            tok.decoder = decoders.Sequence([
                decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ])  # fmt: skip
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
            tok.decoder = decoders.Metaspace("▁", prepend_scheme="first", split=False)
        trainer = trainers.BpeTrainer(
            vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>", *BYTES],
            limit_alphabet=150, show_progress=False,
        )  # fmt: skip
        return tok, trainer
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=case == "roberta", use_regex=False)
    if case in ("gpt2", "roberta"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=case == "roberta")
    else:
        pattern = LLAMA3_PATTERN if case == "llama3" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(pattern), "isolated"), byte_level]
        )
        if case == "qwen2":
            tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<|endoftext|>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    return tok, trainer


def trained(case: str, lines: list[str]) -> dict:
    """The `tokenizer.json` dict of `case`, trained by `tokenizers` on `lines`."""
    if case == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace("▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=2000, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
            unk_token="<unk>", show_progress=False,
        )  # fmt: skip
    else:
        tok, trainer = _bpe(case)
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    if case in ("llama2", "mistral"):  # byte tokens live in the vocabulary, as in Llama's
        spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in BYTES]
    if case == "llama3":
        spec["model"]["ignore_merges"] = True
    return spec
