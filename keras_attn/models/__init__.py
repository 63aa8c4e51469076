"""Models composed from keras_attn layers with the functional API: backbones (ids to hidden
states) and the tasks that hold one (a head, a loss, an optional preprocessor)."""

from keras_attn.models.backbone import Backbone
from keras_attn.models.causal_lm import CausalLM, DecoderBackbone, build_causal_lm, lm_loss
from keras_attn.models.encoder import Encoder, EncoderBackbone
from keras_attn.models.generation import generate
from keras_attn.models.heads import (
    MultipleChoice,
    SequenceClassifier,
    SpanQA,
    TokenClassifier,
    best_spans,
)
from keras_attn.models.pretraining import EncoderPretrainer, MaskedLM, MaskedLMHead
from keras_attn.models.seq2seq import Seq2Seq, Seq2SeqBackbone, Seq2SeqLM
from keras_attn.models.task import Task, resolve_jit_compile

__all__ = [
    "Backbone",
    "CausalLM",
    "DecoderBackbone",
    "Encoder",
    "EncoderBackbone",
    "EncoderPretrainer",
    "MaskedLM",
    "MaskedLMHead",
    "MultipleChoice",
    "Seq2Seq",
    "Seq2SeqBackbone",
    "Seq2SeqLM",
    "SequenceClassifier",
    "SpanQA",
    "Task",
    "TokenClassifier",
    "best_spans",
    "build_causal_lm",
    "generate",
    "lm_loss",
    "resolve_jit_compile",
]
