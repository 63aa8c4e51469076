"""Reading and verifying an artifact folder's manifest.json (no TensorFlow, no Keras)."""

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact folder is missing files, or a file does not match its manifest hash."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"no {MANIFEST} in {folder}: not an exported artifact folder")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def verify_files(folder, manifest: dict, prefixes=("",)) -> None:
    """Checks the sha256 of every manifest file under one of `prefixes`."""
    folder = Path(folder)
    for rel, expected in manifest.get("files", {}).items():
        if not rel.startswith(tuple(prefixes)):
            continue
        path = folder / rel
        if not path.is_file():
            raise ArtifactError(f"{rel} is listed in {MANIFEST} but missing from {folder}")
        if sha256(path) != expected:
            raise ArtifactError(f"{rel} does not match its sha256 in {MANIFEST}")
