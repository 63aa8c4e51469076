"""What the CPU can do, for choices that depend on it (int8 weight type), detected rather than
guessed, and recorded in the manifest beside the choice."""

from pathlib import Path

# The flags (as /proc/cpuinfo names them) that change a choice or a figure here.
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
         "amx_bf16")  # fmt: skip
# int8 dot products in hardware: signed int8 weights are accurate and fast with these.
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8")
INT8_WEIGHTS = ("s8", "u8")


def cpu_flags(cpuinfo="/proc/cpuinfo") -> list[str]:
    """The `FLAGS` this CPU has (sorted); empty where /proc/cpuinfo cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            present = set(line.partition(":")[2].split())
            return sorted(flag for flag in FLAGS if flag in present)
    return []


def int8_weight_type(flags) -> str:
    """`"s8"` where the CPU multiplies int8 in hardware (VNNI or AMX): signed weights are then
    accurate and about 2x faster than float32; `"u8"` elsewhere, where signed weights saturate
    (31% drift measured on an AVX-512 CPU without VNNI)."""
    return "s8" if any(flag in flags for flag in INT8_DOT) else "u8"


def choose_int8_weights(requested=None, flags=None) -> dict:
    """The manifest's `quantization` entry: the weight type (`requested`, else detected from
    the CPU flags), how it was chosen, and the flags."""
    flags = cpu_flags() if flags is None else sorted(flags)
    if requested is not None and requested not in INT8_WEIGHTS:
        raise ValueError(
            f"`int8_weights` must be one of {INT8_WEIGHTS} or None. Received: {requested!r}"
        )
    chosen = requested or int8_weight_type(flags)
    return {"weights": chosen, "chosen_by": "argument" if requested else "cpu flags",
            "cpu_flags": flags}  # fmt: skip
