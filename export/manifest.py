"""Writing manifest.json: what an artifact folder holds, how to call it, how well it matches."""

import json
import os
from pathlib import Path

from serving.manifest import MANIFEST, read_manifest, sha256

FORMAT_VERSION = 1

__all__ = ["MANIFEST", "file_hashes", "read_manifest", "write_manifest"]


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


def write_manifest(folder: Path, content: dict) -> dict:
    manifest = {"format_version": FORMAT_VERSION, **content, "files": file_hashes(folder)}
    with open(folder / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, allow_nan=False)  # strict JSON: no bare NaN
    return manifest
