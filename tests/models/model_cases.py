"""Small instances of every model family and head, with inputs, shared by the model tests."""

import keras
import numpy as np

from keras_attn.models import (
    CausalLM,
    Encoder,
    EncoderPretrainer,
    MaskedLM,
    MultipleChoice,
    Seq2Seq,
    SequenceClassifier,
    SpanQA,
    TokenClassifier,
)

VOCAB = 40
TOKENS = np.array([[1, 5, 6, 7, 2, 0], [1, 8, 9, 2, 3, 4]], "int32")
SEGMENTS = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], "int32")
ENCODER_INPUTS = {"token_ids": TOKENS, "segment_ids": SEGMENTS}


def encoder(**kwargs):
    args = {"hidden_dim": 16, "num_layers": 1, "num_heads": 2, "dropout": 0.0}
    return Encoder(VOCAB, 16, **{**args, **kwargs})


def choices(x):
    return np.stack([x, x[::-1], np.roll(x, 1, axis=0)], axis=1)  # (batch, 3 choices, seq)


def seq2seq(**kwargs):
    args = {"hidden_dim": 16, "num_heads": 2, "num_encoder_layers": 1, "num_decoder_layers": 2}
    return Seq2Seq(VOCAB, 16, **{**args, "dropout": 0.0, **kwargs})


SEQ2SEQ_INPUTS = {
    "encoder_token_ids": np.array([[5, 6, 7, 0], [8, 9, 10, 11]], "int32"),
    "decoder_token_ids": np.array([[1, 12, 13, 0, 0], [1, 14, 15, 16, 17]], "int32"),
}

# name -> (factory, inputs, targets for one fit step)
MODELS = {
    "causal_lm": (
        lambda: CausalLM(VOCAB, 16, hidden_dim=16, num_layers=1, num_heads=2),
        TOKENS,
        np.roll(TOKENS, -1, axis=1),
    ),
    "causal_lm_padding_mask": (
        lambda: CausalLM(
            VOCAB, 16, hidden_dim=16, num_layers=1, num_heads=2, padding_mask_input=True
        ),
        {"token_ids": TOKENS, "padding_mask": (TOKENS != 0).astype("int32")},
        np.roll(TOKENS, -1, axis=1),
    ),
    "causal_lm_llama": (  # rotary GQA, RMSNorm, SwiGLU, no biases, untied output
        lambda: CausalLM(
            VOCAB,
            16,
            hidden_dim=32,
            num_layers=1,
            num_heads=2,
            num_key_value_heads=1,
            position_encoding="rotary",
            normalization="rms_norm",
            gated_feed_forward=True,
            activation="swish",
            attention_bias=False,
            feed_forward_bias=False,
            tie_word_embeddings=False,
            mask_zero=False,
        ),
        TOKENS,
        np.roll(TOKENS, -1, axis=1),
    ),
    "seq2seq_shared": (seq2seq, SEQ2SEQ_INPUTS, np.array([[12, 13, 2, 0, 0], [14, 15, 16, 17, 2]])),
    "seq2seq_separate": (
        lambda: seq2seq(
            target_vocabulary_size=30, position_encoding="learned", normalize_first=True
        ),
        SEQ2SEQ_INPUTS,
        np.array([[12, 13, 2, 0, 0], [14, 15, 16, 17, 2]]),
    ),
    # The pretrained families' options: T5's relative bias, RMSNorm, gated GELU, scaled head;
    # BART's offset positions, embedding norm, scale and output bias with padding id 1.
    "seq2seq_t5": (
        lambda: seq2seq(
            position_encoding="relative",
            normalize_first=True,
            normalization="rms_norm",
            gated_feed_forward=True,
            activation="gelu_tanh",
            score="dot",
            attention_bias=False,
            feed_forward_bias=False,
            tie_word_embeddings=False,
            logit_scale=0.25,
            head_dim=6,
            mask_decoder_padding=False,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=12,
            decoder_start_token_id=0,
        ),
        SEQ2SEQ_INPUTS,
        np.array([[12, 13, 2, 0, 0], [14, 15, 16, 17, 2]]),
    ),
    "seq2seq_bart": (
        lambda: seq2seq(
            position_encoding="learned",
            position_offset=2,
            embedding_layer_norm=True,
            scale_embedding=True,
            output_bias=True,
            pad_token_id=1,
            mask_decoder_padding=False,
            activation="gelu",
        ),
        {
            "encoder_token_ids": np.array([[5, 6, 7, 1], [8, 9, 10, 11]], "int32"),
            "decoder_token_ids": np.array([[2, 12, 13, 1, 1], [2, 14, 15, 16, 17]], "int32"),
        },
        np.array([[12, 13, 2, 1, 1], [14, 15, 16, 17, 2]]),
    ),
    "classifier_cls": (lambda: SequenceClassifier(encoder(), 3), ENCODER_INPUTS, np.array([0, 2])),
    "classifier_mean": (
        lambda: SequenceClassifier(encoder(normalize_first=True), 3, pooling="mean", dropout=0.2),
        ENCODER_INPUTS,
        np.array([1, 2]),
    ),
    "token_classifier": (
        lambda: TokenClassifier(encoder(num_segments=None), 5, ignore_label=-1),
        {"token_ids": TOKENS},
        np.array([[-1, 1, 2, 3, -1, -1], [-1, 4, 0, -1, 1, 1]]),
    ),
    "span_qa": (
        lambda: SpanQA(encoder()),
        ENCODER_INPUTS,
        {"start_logits": np.array([2, 3]), "end_logits": np.array([3, 5])},
    ),
    "multiple_choice": (
        lambda: MultipleChoice(encoder(), 3, dropout=0.0),
        {"token_ids": choices(TOKENS), "segment_ids": choices(SEGMENTS)},
        np.array([0, 2]),
    ),
    "pretrainer": (
        lambda: EncoderPretrainer(encoder()),
        {**ENCODER_INPUTS, "mask_positions": np.array([[2, 3], [1, 0]], "int32")},
        {"mlm": np.array([[6, 7], [8, 0]]), "nsp": np.array([1, 0])},
    ),
    "masked_lm": (
        lambda: MaskedLM(encoder(num_segments=None)),
        {"token_ids": TOKENS, "mask_positions": np.array([[2, 3], [1, 0]], "int32")},
        np.array([[6, 7], [8, 0]]),
    ),
}


def build(name):
    keras.utils.set_random_seed(0)
    factory, inputs, targets = MODELS[name]
    return factory(), inputs, targets
