"""Writing manifest.json: what an artifact folder holds, how to call it, how well it matches.

The schema lives in `keras_attn_serving.manifest` (a leaf module: pydantic and the standard
library only), so the writer and the reader cannot drift apart."""

import os
from pathlib import Path

from keras_attn_serving.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    Manifest,
    parse_manifest,
    read_manifest,
    sha256,
)

__all__ = ["MANIFEST", "Manifest", "file_hashes", "read_manifest", "write_manifest"]


def file_hashes(folder: Path) -> dict[str, str]:
    """`{relative/path: sha256}` of every file below `folder` except the manifest."""
    hashes = {}
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel != MANIFEST:
                hashes[rel] = sha256(path)
    return dict(sorted(hashes.items()))


def write_manifest(folder: Path, content: dict) -> Manifest:
    """Checks `content` against the schema, adds the version and every file's sha256, and
    writes strict JSON (no bare NaN)."""
    manifest = parse_manifest(
        {"format_version": FORMAT_VERSION, **content, "files": file_hashes(folder)}
    )
    (folder / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")
    return manifest
