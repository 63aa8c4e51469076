"""What `export_model` prints when it is done: the parity table (or, for a generation-only
artifact, the decode graph's check), a quantized decode graph's cost, and the int8 drift."""

from typing import Any

from keras_attn_export.parity import format_table
from keras_attn_export.weight_only import summary


def print_report(
    rows: list[dict[str, Any]],
    tolerance: float | dict[str, float],
    worst: float,
    decoding: dict[str, Any] | None,
    weight_only: dict[str, Any] | None,
    quantization: dict[str, Any] | None,
    int8: dict[str, dict[str, float]] | None,
) -> None:
    if rows:
        print(format_table(rows, tolerance))
    else:  # formats=["generation"]: the decode graph's checks are the parity
        before = " (float32, before quantizing)" if weight_only else ""
        print(f"decode_gqa.onnx: logits within {worst:.3e} of Keras at every step, greedy ids "
              f"equal to Keras generate(){before}")  # fmt: skip
    if weight_only and decoding:
        print(summary(decoding["gqa"]["file"], decoding["gqa"]["weights"]))
    chosen = quantization or {}
    for name, drift in (int8 or {}).items():
        print(
            f"int8 {name}: max |difference| {drift['max_abs_diff']:.3e} "
            f"({drift['relative_drift']:.1%} of the largest output), "
            f"argmax agreement {drift['argmax_agreement']:.1%} ({chosen.get('weights')} "
            f"weights, by {chosen.get('chosen_by')})"
        )
