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

    def save_pretrained(
        self, folder: str | os.PathLike[str], tokenizer: Any = None, **kwargs: Any
    ) -> None:
        """Writes `config.json`, `model.safetensors` (and `vocab.txt`) in the Hugging Face
        layout (`model_type`, `max_shard_size`: see `keras_attn.pretrained.save_pretrained`)."""
        save_pretrained(self, folder, tokenizer=tokenizer, **kwargs)
