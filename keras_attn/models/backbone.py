"""What every backbone shares: a functional model from ids to hidden states, rebuilt from its
constructor arguments, loadable from a Hugging Face folder."""

import os
from typing import Any, Self

from keras_attn.models.task import ConfigModel
from keras_attn.pretrained import load_pretrained, save_pretrained


class HoldsBackbone:
    """Mixed into a task whose `backbone` answers some attributes for it (`lm.hidden_dim` is
    `lm.backbone.hidden_dim`): those named in `backbone_attributes`."""

    backbone_attributes: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. On PyTorch a layer is a `torch.nn.Module`, which
        # keeps sub-modules (the backbone) in `_modules` and finds them in its own
        # `__getattr__`: that one answers every other name.
        if name in type(self).backbone_attributes:
            return getattr(self.backbone, name)
        parent = getattr(super(), "__getattr__", None)
        if parent is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return parent(name)


class Backbone(ConfigModel):
    """Base of keras_attn backbones (not used on its own): embeddings, Transformer blocks and
    a final norm, from token ids to hidden states, without a task head. Tasks (`CausalLM`,
    `SequenceClassifier`, …) hold one as `task.backbone`.

    Each backbone exposes its layers as attributes: `token_embedding` (the `TokenEmbedding`
    an output head ties to), its blocks and its final norm (None for post-norm).
    """

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike[str], strict: bool = True, **kwargs: Any
    ) -> Self:
        """This backbone with the weights of a Hugging Face folder (`config.json`,
        `model.safetensors`); `kwargs` override constructor arguments read from
        `config.json`. See `keras_attn.pretrained.load_pretrained`."""
        return load_pretrained(folder, cls, strict=strict, **kwargs)

    def enable_lora(
        self, rank: int, target: str | tuple[str, ...] | list[str] = ("query", "value"),
        alpha: float | None = None,
    ) -> None:  # fmt: skip
        """Low-rank adapters (Keras's `enable_lora`) of `rank` on the projections named in
        `target` (`"query"`, `"key"`, `"value"`, `"attention_output"`, `"intermediate"`,
        `"gate"`, `"output"`; default query and value, as keras-hub); every other backbone
        weight is frozen, a task's head still trains. `alpha` scales the adapters by
        `alpha / rank` (default `rank`). Saved in the config: a `.keras` file reloads with
        them. See `keras_attn.models.lora`."""
        from keras_attn.models.lora import enable_lora

        enable_lora(self, rank, target, alpha)

    def save_lora_weights(self, path: str | os.PathLike[str]) -> None:
        """The adapters alone (a safetensors file, with their rank, target and alpha)."""
        from keras_attn.models.lora import save_lora_weights

        save_lora_weights(self, path)

    def load_lora_weights(self, path: str | os.PathLike[str]) -> None:
        """Adapters from `save_lora_weights` (LoRA is enabled as saved if it is not yet)."""
        from keras_attn.models.lora import load_lora_weights

        load_lora_weights(self, path)

    @staticmethod
    def get_layout_map(device_mesh: Any, model_parallel_dim_name: str = "model") -> Any:
        """A `keras.distribution.LayoutMap` that shards this family's big kernels over the
        `model_parallel_dim_name` axis of `device_mesh` (Megatron-style, keras-hub's
        convention): the query, key and value projections by head and the attention output
        projection by its input heads; the feed-forward's intermediate (and gate) kernels by
        output unit and its output kernel by input unit; token embeddings by vocabulary row
        and an untied output head by vocabulary column. Everything else is replicated. Pass
        it to `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)` and set
        the distribution before building the model. The sharded sizes (heads, key/value
        heads, intermediate size, vocabulary) must divide by that axis's size.

        Example:
            >>> import keras
            >>> mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], ["cpu:0"])
            >>> layout = Backbone.get_layout_map(mesh)
            >>> layout["decoder_block_0/self_attention/query/kernel"].axes
            (None, 'model', None)
        """
        import keras

        names = list(getattr(device_mesh, "axis_names", []))
        if model_parallel_dim_name not in names:
            raise ValueError(
                "`model_parallel_dim_name` must be an axis of `device_mesh` "
                f"{names}. Received: {model_parallel_dim_name!r}"
            )
        model = model_parallel_dim_name
        layout_map = keras.distribution.LayoutMap(device_mesh)
        # Keys are regexes matched against whole variable paths (`re.fullmatch`).
        layout_map[r".*token_embedding/embeddings"] = (model, None)
        layout_map[r".*reverse_embeddings"] = (None, model)
        layout_map[r".*attention/(query|key|value)/kernel"] = (None, model, None)
        layout_map[r".*attention/attention_output/kernel"] = (model, None, None)
        layout_map[r".*feed_forward/(intermediate|gate)/kernel"] = (None, model)
        layout_map[r".*feed_forward/output/kernel"] = (model, None)
        return layout_map

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        lora = getattr(self, "_keras_attn_lora", None)
        if lora:
            config["lora"] = dict(lora)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        lora = config.pop("lora", None)
        model = super().from_config(config)
        if lora:
            model.enable_lora(**lora)
        return model

    def save_pretrained(
        self, folder: str | os.PathLike[str], tokenizer: Any = None, **kwargs: Any
    ) -> None:
        """Writes `config.json`, `model.safetensors` (and `vocab.txt`) in the Hugging Face
        layout (`model_type`, `max_shard_size`: see `keras_attn.pretrained.save_pretrained`)."""
        save_pretrained(self, folder, tokenizer=tokenizer, **kwargs)
