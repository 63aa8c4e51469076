"""Stand-in checkpoint files for the examples: nothing is downloaded at run time, so the
examples that show a Hugging Face folder write a small one themselves (random weights, a BPE
vocabulary learned here by the `tokenizers` library from the embedded Shakespeare)."""

from typing import Any

from keras_attn.tokenizers.byte_pair import LLAMA3_PATTERN


def learn_bpe(lines: list[str], vocabulary_size: int, llama3: bool = False) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` learned from `lines`: GPT-2's settings, or
    Llama 3's (its pre-tokenizing pattern); `<|endoftext|>` is id 0."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    if llama3:
        bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    else:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocabulary_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    ))  # fmt: skip
    return bpe
