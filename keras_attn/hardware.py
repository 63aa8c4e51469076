"""What the CPU does natively, read from /proc/cpuinfo: the facts behind choices whose best
value depends on the machine (XLA for low-precision training here, the int8 weight type in
`keras_attn_export`). A flag table only says what instructions exist; where speed is what
matters and a table has been wrong, the choice is measured instead (int8 weights)."""

from pathlib import Path

# The flags (as /proc/cpuinfo names them) that change a choice or a figure here.
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
         "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")  # fmt: skip
# Low-precision matmuls in hardware, per compute dtype.
NATIVE = {
    "bfloat16": ("avx512_bf16", "amx_bf16"),
    "float16": ("avx512_fp16", "amx_fp16"),
}


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
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


def native_low_precision(compute_dtype: str, flags: list[str] | None = None) -> bool:
    """Whether the CPU multiplies `compute_dtype` (`"bfloat16"`, `"float16"`) in hardware."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in NATIVE.get(compute_dtype, ()))
