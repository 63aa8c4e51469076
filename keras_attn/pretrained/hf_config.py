"""What every checkpoint layout reads from and writes to `config.json` the same way: sizes,
activation names, the buffers a checkpoint may carry that are not weights, and the check that
a model can be written in a layout at all."""

from collections.abc import Sequence
from typing import Any

# Buffers some checkpoints carry that are not weights (position ids, GPT-2's causal mask).
IGNORED_SUFFIXES = (
    "embeddings.position_ids", "attn.bias", "attn.masked_bias", "rotary_emb.inv_freq",
)  # fmt: skip


ACTIVATIONS = {  # Hugging Face's name -> ours
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "swish",
    "swish": "swish",
}
HF_ACTIVATIONS = {
    "gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "swish": "silu", "silu": "silu",
}  # fmt: skip
SAME_ACTIVATION = {"silu": "swish"}  # Keras's two names of one function


def activation(name: str) -> str:
    """Our activation for a `config.json`'s `hidden_act`."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"config.json's activation is not supported. Received: {name!r}; supported: "
            f"{sorted(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def hf_activation(model: Any) -> str:
    """The `hidden_act` of our model's activation."""
    if model.activation not in HF_ACTIVATIONS:
        raise ValueError(
            "`activation` has no Hugging Face name. Received: "
            f"activation={model.activation!r}; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[model.activation]


def require(config: dict[str, Any], *names: str) -> list[Any]:
    """The values of `names` in `config`, or a `ValueError` naming those it lacks."""
    missing = [name for name in names if name not in config]
    if missing:
        raise ValueError(f"config.json lacks {missing} (model_type {config.get('model_type')!r}).")
    return [config[name] for name in names]


def sizes(config: dict[str, Any], names: Sequence[str], **rest: Any) -> dict[str, Any]:
    """A backbone's sizes from `config.json` keys `names` (vocabulary, width, layers, heads,
    feed-forward width, positions), plus `rest`."""
    vocab, hidden, layers, heads, inner, positions = require(config, *names)
    return {
        "vocabulary_size": vocab,
        "max_sequence_length": positions,
        "hidden_dim": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "intermediate_dim": inner,
        **rest,
    }


def check_exportable(model: Any, **expected: Any) -> None:
    """`save_pretrained` writes only what the architecture can express."""
    for name, value in expected.items():
        found = getattr(model, name)
        if name == "activation":
            found = SAME_ACTIVATION.get(found, found)
        if found != value:
            raise ValueError(
                f"This model cannot be written as a Hugging Face checkpoint: `{name}` must be "
                f"{value!r}. Received: {name}={getattr(model, name)!r}"
            )


# Keys a `PretrainedConfig` may carry that do not change the forward pass: bookkeeping, labels,
# special-token ids, training-only switches, the generation defaults `transformers` 4 kept in
# config.json, and keys of older versions that no model class reads any more (`output_past`
# in xlm-roberta and distilbert folders; BERT's original `pooler_*` and `directionality` in
# bert-base-chinese and multilingual folders). Any other key a layout does not read is refused
# (`check_keys`): a key that changes the math is never met with a silent default.
NEUTRAL_KEYS = frozenset(
    """_name_or_path architectures model_type transformers_version dtype torch_dtype
    _attn_implementation _commit_hash id2label label2id num_labels problem_type finetuning_task
    return_dict use_return_dict output_attentions output_hidden_states output_scores torchscript
    use_cache use_bfloat16 tf_legacy_loss bos_token_id eos_token_id sep_token_id cls_token_id
    unk_token_id mask_token_id decoder_start_token_id initializer_range initializer_factor
    chunk_size_feed_forward tokenizer_class prefix task_specific_params gradient_checkpointing
    classifier_dropout pretraining_tp max_length min_length do_sample early_stopping num_beams
    num_beam_groups diversity_penalty temperature top_k top_p typical_p repetition_penalty
    length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
    num_return_sequences forced_bos_token_id forced_eos_token_id remove_invalid_values
    exponential_decay_length_penalty suppress_tokens begin_suppress_tokens
    return_dict_in_generate output_past _num_labels xla_device language name directionality
    pooler_fc_size pooler_num_attention_heads pooler_num_fc_layers pooler_size_per_head
    pooler_type layerdrop""".split()
)
# Keys whose only supported value is the one that leaves the math alone.
FIXED_KEYS: dict[str, tuple[Any, ...]] = {
    "is_decoder": (False,),
    "add_cross_attention": (False,),
    "is_encoder_decoder": (False,),
    "tie_encoder_decoder": (False,),
    "pruned_heads": ({},),
    "cross_attention_hidden_size": (None,),
}


def check_keys(config: dict[str, Any], understood: Sequence[str]) -> None:
    """Refuses a `config.json` key the layout neither reads (`understood`) nor knows to be
    neutral, and a fixed key (`FIXED_KEYS`) set to a value that would change the math."""
    kind = config.get("model_type")
    unknown = sorted(k for k in config if k not in NEUTRAL_KEYS and k not in FIXED_KEYS)
    unknown = [k for k in unknown if k not in understood]
    if unknown:
        raise ValueError(
            f"config.json has keys that model_type {kind!r} does not support: {unknown}. "
            "Keys that may change the computation are refused rather than ignored."
        )
    for key, allowed in FIXED_KEYS.items():
        if key in config and key not in understood and config[key] not in allowed:
            raise ValueError(
                f"config.json's {key} is not supported for model_type {kind!r}. Received: "
                f"{key}={config[key]!r}; supported: {allowed[0]!r}"
            )


# Bounds no real checkpoint reaches; a size past them is a corrupt or hostile config.json.
SIZE_BOUNDS = {
    "vocabulary_size": 1 << 24,
    "max_sequence_length": 1 << 24,
    "hidden_dim": 1 << 17,
    "num_layers": 1 << 10,
    "num_encoder_layers": 1 << 10,
    "num_decoder_layers": 1 << 10,
    "num_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "intermediate_dim": 1 << 20,
    "num_segments": 1 << 10,
    "relative_attention_num_buckets": 1 << 12,
    "relative_attention_max_distance": 1 << 16,
}


def check_sizes(
    kwargs: dict[str, Any], shapes: dict[str, tuple[int, ...]], expected: dict[str, Any]
) -> None:
    """Checks config.json's sizes before anything they size is built: each is a positive int
    within `SIZE_BOUNDS`, and each checkpoint tensor in `expected` (key -> shape) exists with
    that shape.

    Raises:
        ValueError: naming the size, or the tensor with both shapes.
    """
    optional = ("num_key_value_heads", "head_dim", "num_segments", "max_sequence_length")
    for name, bound in SIZE_BOUNDS.items():
        if name not in kwargs and name not in ("vocabulary_size", "hidden_dim", "num_heads"):
            continue  # a size this backbone does not have (layers per side, T5's buckets)
        value = kwargs.get(name)
        if name in optional and (value is None or (not value and name != optional[-1])):
            continue  # optional: None (or no segments) means the default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
            raise ValueError(
                f"config.json's size `{name}` must be an integer in [1, {bound}]. "
                f"Received: {name}={value!r}"
            )
    heads, kv = kwargs["num_heads"], kwargs.get("num_key_value_heads") or kwargs["num_heads"]
    if kwargs.get("head_dim") is None and kwargs["hidden_dim"] % heads:
        raise ValueError(
            f"config.json's hidden size must divide into its heads. Received: "
            f"hidden_size={kwargs['hidden_dim']}, num_attention_heads={heads}"
        )
    if heads % kv:
        raise ValueError(
            f"config.json's num_attention_heads must be a multiple of num_key_value_heads. "
            f"Received: num_attention_heads={heads}, num_key_value_heads={kv}"
        )
    for key, shape in expected.items():
        if key not in shapes:
            raise ValueError(
                f"The checkpoint lacks {key!r}, which config.json's sizes imply "
                f"(layers: {kwargs.get('num_layers', kwargs.get('num_encoder_layers'))})."
            )
        if tuple(shapes[key]) != tuple(shape):
            raise ValueError(
                f"Checkpoint tensor {key!r} has shape {tuple(shapes[key])}; config.json's sizes "
                f"need {tuple(shape)} (config.json and the weights disagree)."
            )
