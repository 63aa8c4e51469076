"""SentencePiece tokenization: trained with the `sentencepiece` package, run in-graph by tf-text."""

import io
import os
from collections.abc import Iterable, Sequence
from typing import Any

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer, check_special_tokens

MODEL_FILE = "sentencepiece.model"
MODEL_TYPES = ("unigram", "bpe")


def train_sentencepiece(
    data: Iterable[str],
    vocabulary_size: int,
    model_type: str = "unigram",
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    character_coverage: float = 0.9995,
    lowercase: bool = False,
) -> bytes:
    """Trains a SentencePiece model whose first ids are our special tokens, in order.

    `[PAD]`, `[UNK]`, `[BOS]` and `[EOS]` take SentencePiece's own pad/unk/bos/eos roles at
    their positions in `special_tokens`; the other special tokens become control symbols.

    Args:
        data: an iterable of strings (one sentence or line each).
        vocabulary_size: int. Size of the vocabulary, special tokens included.
        model_type: `"unigram"` (default) or `"bpe"`.
        special_tokens: tokens given the lowest ids, in order; must include `[PAD]`, `[UNK]`.
        character_coverage: float. Share of characters the vocabulary must cover.
        lowercase: bool. Lower-case (NFKC + case fold) as part of the model's normalizer.
    Returns:
        bytes: the serialized model proto.
    """
    import sentencepiece as spm

    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"`model_type` must be one of {MODEL_TYPES}. Received: model_type={model_type!r}"
        )
    special_tokens = check_special_tokens(special_tokens)
    if not isinstance(vocabulary_size, int) or vocabulary_size <= len(special_tokens):
        raise ValueError(
            f"`vocabulary_size` must be an integer above the {len(special_tokens)} special "
            f"tokens. Received: vocabulary_size={vocabulary_size!r}"
        )
    if "[UNK]" not in special_tokens:
        raise ValueError(f"`special_tokens` must include '[UNK]'. Received: {special_tokens}")
    roles = {"[PAD]": "pad", "[UNK]": "unk", "[BOS]": "bos", "[EOS]": "eos"}
    ids: dict[str, Any] = {f"{role}_id": -1 for role in ("bos", "eos")}
    pieces: dict[str, Any] = {}
    for index, token in enumerate(special_tokens):
        if token in roles:
            ids[f"{roles[token]}_id"] = index
            pieces[f"{roles[token]}_piece"] = token
    control = [t for t in special_tokens if t not in roles]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(data),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type=model_type,
        character_coverage=character_coverage,
        control_symbols=control,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        minloglevel=2,
        **ids,
        **pieces,
    )
    proto = model.getvalue()
    processor = spm.SentencePieceProcessor(model_proto=proto)
    order = [processor.id_to_piece(i) for i in range(len(special_tokens))]
    if tuple(order) != special_tokens:  # sentencepiece places control symbols itself
        raise ValueError(f"special tokens landed at unexpected ids: {order}")
    return proto


@keras.saving.register_keras_serializable(package="keras_attn")
class SentencePieceTokenizer(Tokenizer):
    """Strings to SentencePiece ids with tensorflow-text's in-graph `SentencepieceTokenizer`.

    Args:
        proto: the serialized model (bytes) or the path of a `.model` file; see
            `train_sentencepiece`. Can be set later with `set_proto`.
        sequence_length, special_tokens: see `Tokenizer`; the special tokens must be the
            model's first pieces.
    Example:
        >>> from keras_attn.data import load_corpus
        >>> lines = load_corpus().lines()[:5000]
        >>> tok = SentencePieceTokenizer(train_sentencepiece(lines, 1000))
        >>> tok.detokenize(tok.tokenize(["to be or not to be"])).numpy()[0].decode()
        'to be or not to be'
    """

    def __init__(
        self,
        proto: bytes | str | None = None,
        sequence_length: int | None = None,
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        self._proto: bytes | None = None
        if proto is not None:
            self.set_proto(proto)

    def set_proto(self, proto: bytes | str) -> None:
        """Sets the model from serialized bytes or a `.model` path."""
        if isinstance(proto, str):
            if not os.path.exists(proto):
                raise ValueError(f"`proto` path does not exist. Received: proto={proto!r}")
            with open(proto, "rb") as f:
                proto = f.read()
        if not isinstance(proto, bytes):
            raise ValueError(f"`proto` must be bytes or a path. Received: {type(proto).__name__}")
        self._tf = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)
        head = [self._tf.id_to_string(i).numpy().decode() for i in range(len(self.special_tokens))]
        if tuple(head) != self.special_tokens:
            raise ValueError(
                f"the model's first pieces must be the special tokens {self.special_tokens}. "
                f"Received: {tuple(head)}"
            )
        self._proto = proto
        self._reset_compiled()
        self.__dict__.pop("_piece_ids", None)

    @property
    def proto(self) -> bytes:
        self._check_proto()
        return self._proto  # type: ignore[return-value]  # not None after _check_proto

    def _check_proto(self):
        if self._proto is None:
            raise ValueError("The tokenizer has no model. Pass `proto=` or call `set_proto`.")

    def vocabulary_size(self) -> int:
        self._check_proto()
        return int(self._tf.vocab_size())

    def id_to_token(self, token_id: int) -> str:
        self._check_proto()
        return self._tf.id_to_string(self._check_id(token_id)).numpy().decode("utf-8")

    def token_to_id(self, token: str) -> int:
        self._check_proto()
        piece_ids = self.__dict__.get("_piece_ids")
        if piece_ids is None:
            pieces = self._tf.id_to_string(tf.range(self.vocabulary_size())).numpy()
            piece_ids = {p.decode("utf-8"): i for i, p in enumerate(pieces)}
            object.__setattr__(self, "_piece_ids", piece_ids)
        if token not in piece_ids:
            raise ValueError(f"`token` is not in the vocabulary. Received: token={token!r}")
        return piece_ids[token]

    def _tokenize(self, strings):
        self._check_proto()
        return self._tf.tokenize(strings)

    def _detokenize(self, ids):
        return self._tf.detokenize(ids)

    def save_assets(self, dir_path: str) -> None:
        with open(os.path.join(dir_path, MODEL_FILE), "wb") as f:
            f.write(self.proto)

    def load_assets(self, dir_path: str) -> None:
        self.set_proto(os.path.join(dir_path, MODEL_FILE))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "proto": None}  # the model travels as an asset file
