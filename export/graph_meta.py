"""What a fused graph says of itself in its metadata: which positions are padding, where
`keras_attn_export.optimize.fuse` made its per-position work skip them
(`keras_attn_export.unpad`). A leaf: the fusion writes it, the q/k/v switch, the export and
the parity check read it."""

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

PADDING_KEY = "keras_attn.unpadded"


def padding_rule(model: "onnx.ModelProto") -> dict | None:
    """`{"input", "pad_token_id", "outputs"}` of a graph `fuse` unpadded, else None:
    positions where that input is the padding id, but for each row's first, are padding, and
    the `outputs` are zero there (graphs written before manifest format 5 say `pad_value`)."""
    for prop in model.metadata_props:
        if prop.key == PADDING_KEY:
            rule = dict(json.loads(prop.value))
            if "pad_value" in rule:
                rule["pad_token_id"] = rule.pop("pad_value")
            return rule
    return None
