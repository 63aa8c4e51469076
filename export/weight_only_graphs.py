"""The weight-only quantized decode graph an export serves (`decode_gqa.int4.onnx`,
`.int8`): written by the decode-graph builder from the measured `WeightOnly`, scored against
the float model on held-out positions, and, where another accuracy level was measured faster
for prompts, its prefill twin (`prefill_gqa.int4.onnx`), kept only if it stays as close to
the float model (`keras_attn_export.weight_only` says what each is)."""

from pathlib import Path
from typing import Any

import numpy as np
from keras_attn_export.weight_only import choose, manifest_entry, quality, write_prefill_twin
from keras_attn_serving.generation import BoundCache, gqa_step

from keras_attn.models.cached import CachedCausalLM

# The prefill twin's last logits may stray from the float model's at most this many times
# the decode graph's worst gap over the held-out positions (it rounds the same weights; at
# float32 activations it rounds less).
TWIN_SLACK = 1.5


def write_weight_only_graph(
    lm: CachedCausalLM,
    folder: Path,
    max_length: int,
    opset: int,
    reference: dict[str, Any],
    weights: dict[str, Any],
) -> dict[str, Any]:
    """`decode_gqa.int4.onnx` (`.int8`): written, scored on `reference["quality"]`; the
    `gqa` entry's `file`, `external_data` and `weights`. Where another accuracy level was
    measured faster for prompts, its prefill twin too (`prefill_gqa.int4.onnx`), checked
    on the held-out prompt whole against the float model."""
    import onnxruntime as ort
    from keras_attn_export.decode_graph import write_decode_graph

    first = lm.decoder_blocks[0].feed_forward.intermediate_dense.kernel.shape
    weight_only, how = choose(
        weights["weights"], weights["block_size"], weights["accuracy_level"],
        (int(first[0]), int(first[-1])),
    )  # fmt: skip
    name = f"decode_gqa.{weights['weights']}.onnx"
    spec = write_decode_graph(lm, folder / name, max_length, opset, weights=weight_only)
    session = ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
    held_out = reference["quality"]
    measured = quality(gqa_step(session), BoundCache(session, spec, 1), held_out["ids"],
                       held_out["full"])  # fmt: skip
    measured["source"] = held_out["source"]
    del session
    if "prefill" in how:
        _prefill_twin(folder, name, spec, how, held_out, measured)
    return {
        "file": name,
        "external_data": spec.get("external_data"),
        "weights": manifest_entry(weights["weights"], weight_only, how, measured),
    }


def _prefill_twin(
    folder: Path,
    name: str,
    spec: dict[str, Any],
    how: dict[str, Any],
    held_out: dict[str, Any],
    measured: dict[str, Any],
) -> None:
    """Writes the prefill twin of the graph `name` that `how["prefill"]` asks for and checks
    it: its last logits over the whole held-out prompt against the float model's. A twin
    further from them than `TWIN_SLACK` times the step graph's worst gap is removed, and
    `how` then names none."""
    import onnxruntime as ort

    twin = name.replace("decode_gqa.", "prefill_gqa.", 1)
    write_prefill_twin(folder / name, folder / twin, how["prefill"]["accuracy_level"])
    session = ort.InferenceSession(str(folder / twin), providers=["CPUExecutionProvider"])
    ids, full = held_out["ids"], held_out["full"]
    logits, _ = gqa_step(session)(ids, BoundCache(session, spec, 1), 0)
    gap = float(np.max(np.abs(logits - full[:, -1])))
    del session
    if gap > TWIN_SLACK * max(measured["max_abs_logit_diff"], 1e-6):
        (folder / twin).unlink()
        how.pop("prefill")
        return
    how["prefill"] |= {
        "file": twin,
        "max_abs_logit_diff": gap,
        "top1_equals_float": bool(np.argmax(logits, -1)[0] == np.argmax(full[:, -1], -1)[0]),
    }
