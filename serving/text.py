"""Text endpoints: an exported model's task run on raw text, tokenized in the server.

The artifact's `manifest.json` says what the model does (`task`: `classify`, `tag`, `embed`
or `generate`), how one text becomes ids (`tokenizer/`, and `packer`: start/end ids around
them, as at training time) and, optionally, the class names (`labels`). `TextModel` turns
texts into the model's inputs and its outputs back into answers; the server runs the model
in between (through its batcher), so these functions never call onnxruntime themselves,
except `TextModel.stream`, which drives the decode graph step by step.
"""

import re
from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.text_generation import Generation

if TYPE_CHECKING:
    from keras_attn_serving.batching import Batcher
    from keras_attn_serving.predictor import Predictor
    from keras_attn_serving.tokenizer import JsonTextTokenizer, WordPieceTextTokenizer
    from numpy.typing import ArrayLike

TEXT_TASKS = ("classify", "tag", "embed", "generate")
# The `parameters` each text endpoint reads; any other is refused with a 400.
TEXT_PARAMETERS = {
    "classify": frozenset(),
    "tag": frozenset(),
    "embed": frozenset({"pooling", "normalize"}),
    "generate": frozenset(
        {
            "max_tokens",
            "max_new_tokens",
            "stop",
            "stop_token_ids",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "num_beams",
            "length_penalty",
            "early_stopping",
            "no_repeat_ngram_size",
        }
    ),
}


# A first guess at the characters that hold a number of tokens (WordPiece averages about 4).
CHARS_PER_TOKEN = 8
WORD_BOUNDARY = re.compile(r"[ \t\n\r]")  # whitespace to every tokenizer here


def word_prefix(text: str, chars: int) -> str:
    """`text` up to the first ASCII whitespace at or after `chars` (all of it if none)."""
    if len(text) <= chars:
        return text
    boundary = WORD_BOUNDARY.search(text, chars)
    return text if boundary is None else text[: boundary.start()]


def softmax(logits: "ArrayLike") -> np.ndarray:
    shifted = np.asarray(logits, np.float64)
    shifted = np.exp(shifted - shifted.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


class TextModel(Generation):
    """Raw text in, task answers out, for one exported model (`Predictor`)."""

    def __init__(self, predictor: "Predictor", batcher: "Batcher | None" = None) -> None:
        self.predictor = predictor
        self.batcher = batcher  # the server's, for `predictor`
        manifest = predictor.manifest
        self.task = manifest.task
        self.labels = manifest.labels
        self.packer = manifest.packer.model_dump() if manifest.packer else {}
        # `/embed`'s defaults: the checkpoint's pooling when it named one, else mean, raw.
        embedding = getattr(manifest, "embedding", None)
        self.embedding = (embedding.model_dump() if embedding
                          else {"pooling": "mean", "normalize": False})  # fmt: skip
        self.tokenizer = predictor.tokenizer
        self.input_names = list(predictor.inputs)
        # A model exported with a fixed sequence axis (a packer inside a user's model) takes
        # rows of exactly that length.
        axes = manifest.inputs[0].shape if manifest.inputs else []
        self.fixed_length = axes[1] if len(axes) == 2 and isinstance(axes[1], int) else None

    @property
    def words(self) -> "WordPieceTextTokenizer | JsonTextTokenizer":
        """The tokenizer; `ServingError` 400 for a model exported without one."""
        if self.tokenizer is None:
            raise ServingError(400, "this model was exported without a tokenizer: text "
                                    "endpoints need one (export_model(tokenizer=...))")  # fmt: skip
        return self.tokenizer

    def require(self, task: str) -> None:
        """`ServingError` 400 unless this model answers `task` from text."""
        self.words  # noqa: B018  (raises without a tokenizer)
        generates = task == "generate" and self.predictor.encoder_decoder is not None
        if self.task != task and not generates:
            raise ServingError(
                400, f"this model's task is {self.task!r}; it has no {task!r} endpoint "
                     f"(text endpoints: {', '.join(TEXT_TASKS)})",
            )  # fmt: skip

    @staticmethod
    def texts(payload: Any) -> list[str]:
        """The `text_input` of a request body (one string or a list of them), as a list."""
        text = payload.get("text_input") if isinstance(payload, dict) else None
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ServingError(
                400, "request body must be {\"text_input\": a string or a non-empty list of "
                     f"strings}}; received text_input={shown(text)}"[:300],
            )  # fmt: skip
        for index, one in enumerate(texts):
            try:
                one.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate such as "\ud800"
                raise ServingError(
                    400, f"text_input[{index}] is not valid Unicode text: {error.reason} at "
                         f"position {error.start} (U+{ord(one[error.start]):04X})",
                ) from None  # fmt: skip
        return texts

    def room(self) -> int | None:
        """Token ids a text may have once packed (the packer's or the model's length, less
        the start/end ids), or None when nothing limits it."""
        start, end = self.packer.get("start_value"), self.packer.get("end_value")
        limits = [x for x in (self.packer.get("sequence_length"), self.fixed_length,
                              self.predictor.max_sequence_length) if x]  # fmt: skip
        return min(limits) - (start is not None) - (end is not None) if limits else None

    def first_ids(self, texts: list[str], keep: int | None) -> list[list[int]]:
        """Each text's token ids, or, when `keep` is given, at least its first `keep` ids
        (all of them when it has fewer): exactly the ids tokenizing the whole text gives,
        cut. The work is proportional to `keep`, not to the text: a text is tokenized from a
        prefix that ends at ASCII whitespace (a word boundary for the tokenizer, so the
        prefix's ids begin the text's ids), lengthened until it yields `keep` ids."""
        if keep is None:
            return self.words.encode(texts)
        found: list[list[int]] = [[] for _ in texts]
        pending, chars = list(range(len(texts))), CHARS_PER_TOKEN * (keep + 1)
        while pending:
            cuts = [word_prefix(texts[i], chars) for i in pending]
            still = []
            for i, cut, ids in zip(pending, cuts, self.words.encode(cuts), strict=True):
                if len(ids) >= keep or len(cut) == len(texts[i]):
                    found[i] = ids
                else:  # whitespace runs: a longer prefix
                    still.append(i)
            pending, chars = still, 4 * chars
        return found

    def encode(
        self, texts: list[str], truncate: bool = True
    ) -> tuple[dict[str, np.ndarray], list[list[int]]]:
        """`(feeds, ids)`: the model's inputs for `texts` (packed as at training time, padded
        to the longest with 0) and each text's ids as packed, one list per text. Texts longer
        than the model takes are cut as the packer cuts them, unless `truncate=False`."""
        start, end = self.packer.get("start_value"), self.packer.get("end_value")
        room = self.room() if truncate else None
        packed = []
        for ids in self.first_ids(texts, room):
            ids = ids[:room]  # truncated as the packer truncates
            packed.append(([start] if start is not None else []) + ids +
                          ([end] if end is not None else []))  # fmt: skip
        return self.pack(packed)

    def encode_pairs(self, pairs: list[tuple[str, str]]
                     ) -> tuple[dict[str, np.ndarray], list[list[int]]]:  # fmt: skip
        """`(feeds, ids)` of text pairs for a model trained on them (a segment packer):
        `[CLS] a [SEP] b [SEP]`, segment ids 0 then 1, shortened by the packer's rule."""
        from keras_attn_serving.pairs import pack_pair

        packer = self.packer
        if packer.get("type") != "segment":
            raise ServingError(400, "this model was not trained on text pairs (its packer "
                                    "packs one text): it cannot rerank")  # fmt: skip
        limits = (packer["sequence_length"], self.fixed_length, self.predictor.max_sequence_length)
        length = min(x for x in limits if x)
        texts = [t for pair in pairs for t in pair]
        ids = self.first_ids(texts, length)
        rows, segments = [], []
        start, end = packer["start_value"], packer["end_value"]
        rule = packer.get("truncate") or "round_robin"
        for k in range(len(pairs)):
            row, segment = pack_pair(ids[2 * k], ids[2 * k + 1], length, start, end, rule)
            rows.append(row)
            segments.append(segment)
        return self.pack(rows, segments)

    def pack(self, packed: list[list[int]], segments: list[list[int]] | None = None
             ) -> tuple[dict[str, np.ndarray], list[list[int]]]:  # fmt: skip
        """`(feeds, packed)`: the model's inputs for rows of ids already packed (and their
        segment ids, 0 when not given), padded to the longest with 0."""
        self.check_ids([i for ids in packed for i in ids], "text_input")
        width = self.fixed_length or max(1, max(len(ids) for ids in packed))
        token_ids = np.zeros((len(packed), width), np.int32)
        for row, ids in enumerate(packed):
            token_ids[row, : len(ids)] = ids
        feeds = {}
        for name in self.input_names:
            if name == "token_ids" or len(self.input_names) == 1:
                feeds[name] = token_ids
            elif name == "segment_ids":
                feeds[name] = np.zeros_like(token_ids)
                for row, ids in enumerate(segments or []):
                    feeds[name][row, : len(ids)] = ids
            elif name == "padding_mask":
                lengths = np.array([len(ids) for ids in packed])
                feeds[name] = (np.arange(width) < lengths[:, None]).astype(np.int32)
            else:
                raise ServingError(400, f"text endpoints cannot fill model input {name!r}")
        return feeds, packed

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else str(index)

    def classify(self, outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """One `{label, label_id, score, scores}` per text from `(batch, classes)` logits."""
        probabilities = softmax(next(iter(outputs.values())))
        answers = []
        for row in probabilities:
            best = int(row.argmax())
            answers.append({
                "label": self.label(best), "label_id": best, "score": float(row[best]),
                "scores": {self.label(i): float(p) for i, p in enumerate(row)},
            })  # fmt: skip
        return answers

    def tag(
        self, outputs: dict[str, np.ndarray], packed: list[list[int]]
    ) -> list[list[dict[str, Any]]]:
        """Per text, one `{token, label, label_id, score}` per word piece (start/end ids of
        the packer left out) from `(batch, sequence, classes)` logits."""
        probabilities = softmax(next(iter(outputs.values())))
        specials = {self.packer.get("start_value"), self.packer.get("end_value")} - {None}
        answers = []
        for row, ids in enumerate(packed):
            tokens = []
            for position, token in enumerate(ids):
                if token in specials:
                    continue
                best = int(probabilities[row, position].argmax())
                tokens.append({
                    "token": self.words.token(token), "label": self.label(best),
                    "label_id": best, "score": float(probabilities[row, position, best]),
                })  # fmt: skip
            answers.append(tokens)
        return answers

    def embed(
        self,
        outputs: dict[str, np.ndarray],
        packed: list[list[int]],
        pooling: str = "mean",
        normalize: bool = False,
    ) -> list[list[float]]:
        """One vector per text: the mean of `sequence_output` over the text's positions
        (`pooling="mean"`) or the `pooled_output` (`"cls"`), optionally L2-normalized.

        A model with one output (exported with `task="embed"`) gives its vectors itself when
        that output is `(batch, dim)`, or has them mean-pooled when it is `(batch, seq, dim)`.
        """
        if pooling not in ("mean", "cls"):
            raise ServingError(400, f"`pooling` must be 'mean' or 'cls'; received {pooling!r}")
        if "sequence_output" not in outputs and len(outputs) == 1:
            (single,) = outputs.values()
            if np.ndim(single) == 2:
                outputs = {"pooled_output": single}
            else:
                outputs = {"sequence_output": single}
        if pooling == "cls" or "sequence_output" not in outputs:
            if "pooled_output" not in outputs:
                raise ServingError(400, "this encoder has no pooled_output: use pooling='mean'")
            vectors = np.asarray(outputs["pooled_output"], np.float64)
        else:
            sequence = np.asarray(outputs["sequence_output"], np.float64)
            real = np.zeros(sequence.shape[:2])
            for row, ids in enumerate(packed):
                real[row, : len(ids)] = 1.0
            vectors = (sequence * real[..., None]).sum(1) / real.sum(1, keepdims=True)
        if normalize:
            vectors = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
        return vectors.tolist()

    @property
    def prompt_limit(self) -> int | None:
        """Most ids a generation prompt may have, the new ids' room aside: an
        encoder-decoder's source, what the encoder takes; a decoder's, the positions it
        decodes into (`Predictor.decode_limit`)."""
        if self.predictor.encoder_decoder is not None:
            return self.predictor.max_sequence_length
        return self.predictor.decode_limit

    def prompt(self, text: str, field: str = "text_input") -> list[int]:
        """A generation prompt's ids: packed with the start id but no end id (it continues),
        and never cut: a prompt the model cannot take is a `ServingError` 400, found by
        tokenizing no more of it than the model's length. An encoder-decoder's prompt is its
        source, packed as in training (start and end ids)."""
        if self.predictor.encoder_decoder is not None:
            limit = self.room()
            (ids,) = self.first_ids([text], None if limit is None else limit + 1)
            if limit is not None and len(ids) > limit:
                raise ServingError(400, f"the source has more than {limit} tokens, the most "
                                        "the encoder takes", param=field)  # fmt: skip
            return self.packed_ids(ids, field)
        start = self.packer.get("start_value")
        limit = self.prompt_limit
        keep = None if limit is None else limit + 1 - (start is not None)
        (ids,) = self.first_ids([text], keep)
        if keep is not None and len(ids) >= keep:
            raise ServingError(
                400, f"the prompt has more than {keep - 1} tokens; the model takes at most "
                     f"{limit} positions, prompt and new tokens together", param=field,
            )  # fmt: skip
        ids = ([start] if start is not None else []) + ids
        if not ids:
            raise ServingError(400, f"`{field}` has no tokens: give a non-empty prompt",
                               param=field)  # fmt: skip
        self.check_ids(ids, field)
        return ids

    def chat_prompt(self, chat: Any, messages: Any) -> list[int]:
        """A conversation's prompt ids: rendered by the chat template (`ChatTemplateError`
        is a 400 with its message), tokenized with no special tokens added (the template
        writes them, as `transformers` tokenizes a rendered chat); the same length and
        vocabulary checks as `prompt`."""
        from keras_attn_serving.chat_template import ChatTemplateError

        try:
            text = chat.render(messages, add_generation_prompt=True)
        except ChatTemplateError as error:
            raise ServingError(400, str(error), param="messages") from None
        limit = self.prompt_limit
        (ids,) = self.first_ids([text], None if limit is None else limit + 1)
        return self.id_prompt(ids, field="messages")

    def id_prompt(self, ids: Any, packed: bool = True, field: str = "prompt") -> list[int]:
        """Token ids given by a client, checked: ids of the model and of its tokenizer, and
        (`packed`: a prompt) shorter than the model's length."""
        limit = self.prompt_limit if packed else self.predictor.max_sequence_length
        if not ids:
            raise ServingError(400, f"`{field}` has no tokens: give a non-empty prompt",
                               param=field)  # fmt: skip
        if limit is not None and len(ids) >= limit + (not packed):  # before reading the ids
            raise ServingError(
                400, f"`{field}` has {len(ids)} tokens; the model takes at most {limit} "
                     "positions, prompt and new tokens together", param=field,
            )  # fmt: skip
        size = self.words.vocabulary_size
        outside = sorted({i for i in ids if not 0 <= i < size})
        if outside:
            raise ServingError(400, f"`{field}` has ids {outside[:3]} outside the tokenizer's "
                                    f"[0, {size})", param=field)  # fmt: skip
        self.check_ids(list(ids), field)
        return list(ids)

    def packed_ids(self, ids: list[int], field: str) -> list[int]:
        """A client's token ids for an encoder, packed as a text's ids are (the packer's
        start and end ids around them); more than the model takes is a 400."""
        ids = self.id_prompt(ids, packed=False, field=field)
        room = self.room()
        if room is not None and len(ids) > room:
            raise ServingError(400, f"`{field}` has {len(ids)} tokens; the model takes "
                                    f"{room} besides its start/end ids", param=field)  # fmt: skip
        start, end = self.packer.get("start_value"), self.packer.get("end_value")
        return ([start] if start is not None else []) + ids + ([end] if end is not None else [])

    def check_ids(self, ids: list[int], field: str) -> None:
        """A `ServingError` 400 when an id is past the model's vocabulary (a tokenizer with
        tokens the model has no embedding for): refused before it joins a shared batch."""
        limit = self.predictor.token_limit
        bad = sorted({i for i in ids if limit is not None and not 0 <= i < limit})
        if bad:
            size = self.words.vocabulary_size
            tokens = [self.words.token(i) for i in bad[:3] if 0 <= i < size]
            raise ServingError(
                400, f"`{field}` has tokens {tokens} (ids {bad[:3]}) that the model has no "
                     f"embedding for: its ids are [0, {limit})",
            )  # fmt: skip
