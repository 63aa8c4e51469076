"""The manifest's strict base model and its records of quantized files (`model.int8.onnx`,
weight-only decode graphs); a leaf beside `keras_attn_serving.manifest`, pydantic only."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Every manifest entry's base: an unknown key, NaN or infinity is refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def __getitem__(self, key):
        """Read by key too (`manifest["parity"]["max_abs_diff"]`), as the plain dict that
        `export_model` returned before the manifest was typed."""
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)


class Drift(Strict):
    max_abs_diff: float
    relative_drift: float
    argmax_agreement: float


class Int8Candidate(Strict):
    """One weight type as measured at export: worst relative drift against Keras over the
    outputs, and median milliseconds on the largest parity input."""

    relative_drift: float
    ms: float


class Quantization(Strict):
    """How `model.int8.onnx` was quantized: the weight type, chosen by argument or by
    measurement on the exporting machine (the faster type within `drift_bound`), each
    measured candidate, and that machine's CPU flags."""

    weights: Literal["s8", "u8"]
    chosen_by: Literal["argument", "measurement"]
    cpu_flags: list[str]
    drift_bound: float
    candidates: dict[Literal["s8", "u8"], Int8Candidate] = Field(default_factory=dict)
    # MatMuls kept in float32 (the first feed-forward output projections).
    float_matmuls: list[str] = Field(default_factory=list)


class AccuracyLevelTiming(Strict):
    """One `MatMulNBits` accuracy level as timed at export on the feed-forward's shape."""

    decode_ms: float
    chunk_64_ms: float
    prompt_256_ms: float | None = None  # format 8


class PrefillTwinInfo(Strict):
    """The decode graph again at the accuracy level measured faster for prompts (format 8):
    the same weights file; the server prefills prompts of `min_tokens` or more with it.
    Checked at export on the held-out prompt whole: its last logits against the float
    model's."""

    file: str
    accuracy_level: Literal[1, 4]
    min_tokens: int = Field(ge=1)
    max_abs_logit_diff: float
    top1_equals_float: bool


class WeightQuality(Strict):
    """A quantized decode graph against the float model on held-out positions, teacher
    forced: how often their most likely next tokens agree, and the largest logit gap."""

    positions: int
    top1_agreement: float
    max_abs_logit_diff: float
    source: Literal["held-out text", "random ids"]


class WeightOnlyInfo(Strict):
    """How a decode graph's weights are stored: `bits` per weight in blocks of `block_size`
    with a float32 scale each (symmetric), the kernels' `accuracy_level` (1: float32
    activations, 4: int8), how it was chosen, and what it costs (`quality`)."""

    type: Literal["int8", "int4"]
    bits: Literal[4, 8]
    block_size: int
    accuracy_level: Literal[1, 4]
    symmetric: bool
    cpu_flags: list[str]
    chosen_by: Literal["argument", "measurement"]
    candidates: dict[str, AccuracyLevelTiming] = Field(default_factory=dict)
    measured_shape: list[int] | None = None
    quality: WeightQuality
    prefill: PrefillTwinInfo | None = None
