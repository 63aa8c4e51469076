"""Models composed from keras_attn layers with the functional API, and task heads."""

from keras_attn.models.causal_lm import CausalLM, build_causal_lm, lm_loss
from keras_attn.models.encoder import Encoder
from keras_attn.models.generation import generate
from keras_attn.models.heads import (
    MultipleChoice,
    SequenceClassifier,
    SpanQA,
    TokenClassifier,
    best_spans,
)
from keras_attn.models.pretraining import EncoderPretrainer, MaskedLMHead
from keras_attn.models.seq2seq import Seq2Seq
from keras_attn.models.task import resolve_jit_compile

__all__ = [
    "CausalLM",
    "Encoder",
    "EncoderPretrainer",
    "MaskedLMHead",
    "MultipleChoice",
    "Seq2Seq",
    "SequenceClassifier",
    "SpanQA",
    "TokenClassifier",
    "best_spans",
    "build_causal_lm",
    "generate",
    "lm_loss",
    "resolve_jit_compile",
]
