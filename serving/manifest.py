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


def _plain_name(rel) -> bool:
    """A relative POSIX path inside the folder: no `..`, no absolute path, no backslash."""
    if not isinstance(rel, str) or not rel or "\\" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def referenced_files(manifest: dict) -> list[str]:
    """The files the manifest tells a reader to open (ONNX graphs, decode graphs)."""
    names = []
    onnx = manifest.get("onnx") or {}
    names += [onnx.get("file"), *(onnx.get("files") or [])]
    decoding = manifest.get("decoding") or {}
    names += [decoding.get("file"), (decoding.get("gqa") or {}).get("file")]
    names.append((manifest.get("text_onnx") or {}).get("file"))
    return list(dict.fromkeys(name for name in names if name is not None))


def verify_files(folder, manifest: dict, prefixes=("",)) -> None:
    """The folder is exactly what the manifest lists, byte for byte: every listed file under
    one of `prefixes` matches its sha256, no file is there unlisted, every path is a plain
    name inside the folder, and every file the manifest points to is listed."""
    folder = Path(folder)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{MANIFEST} lists no files")
    for rel in [*files, *referenced_files(manifest)]:
        if not _plain_name(rel):
            raise ArtifactError(
                f"{MANIFEST} names {str(rel)[:80]!r}: not a plain name inside the folder"
            )
    unlisted = [rel for rel in referenced_files(manifest) if rel not in files]
    if unlisted:
        raise ArtifactError(f"{MANIFEST} points to {unlisted} but does not list their sha256")
    on_disk = {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() or path.is_symlink()
    } - {MANIFEST}
    unknown = sorted(rel for rel in on_disk - set(files) if rel.startswith(tuple(prefixes)))
    if unknown:
        raise ArtifactError(f"{unknown[:5]} are in the folder but not in {MANIFEST}")
    for rel, expected in files.items():
        if not rel.startswith(tuple(prefixes)):
            continue
        path = folder / rel
        if path.is_symlink() or not path.is_file():
            raise ArtifactError(f"{rel} is listed in {MANIFEST} but missing from the folder")
        if sha256(path) != expected:
            raise ArtifactError(f"{rel} does not match its sha256 in {MANIFEST}")
