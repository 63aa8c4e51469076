"""Writing an artifact folder so that a crash at any point leaves the old or the new one whole.

An export writes into a temporary sibling `.NAME.tmp-XXXX`, then replaces `NAME` in three
renames: the old folder aside (`.NAME.old-XXXX`), the new one in, the old one deleted. A crash
(even `kill -9`) between any two steps leaves `NAME`, or its old version beside it, whole. The
next export of `NAME` sweeps what a crashed one left: it first puts a set-aside old folder
back when `NAME` is missing, then deletes leftover temporaries.
"""

import os
import shutil
import tempfile
from pathlib import Path


def _siblings(out_dir: Path, kind: str) -> list[Path]:
    prefix = f".{out_dir.name}.{kind}-"
    return sorted(p for p in out_dir.parent.glob(f"{prefix}*") if p.is_dir())


def sweep(out_dir: Path) -> list[str]:
    """Cleans up after crashed exports of `out_dir`; returns what it did, for the log."""
    done: list[str] = []
    if not out_dir.parent.is_dir():
        return done
    set_aside = _siblings(out_dir, "old")
    if not out_dir.exists() and set_aside:
        newest = max(set_aside, key=lambda p: p.stat().st_mtime)
        newest.rename(out_dir)  # the last whole artifact, back where servers look
        done.append(f"restored {out_dir.name} from an interrupted replacement")
    for leftover in _siblings(out_dir, "old") + _siblings(out_dir, "tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed {leftover.name}")
    return done


def temporary_folder(out_dir: Path) -> Path:
    """A fresh `.NAME.tmp-XXXX` beside `out_dir` (readable by servers), after a sweep."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    sweep(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the artifact is meant to be read by servers
    return tmp


def replace(tmp: Path, out_dir: Path) -> None:
    """Moves the finished `tmp` to `out_dir`, replacing an existing folder: old aside, new in,
    old deleted. If the second rename fails, the old folder goes back."""
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(old)  # a unique name; rename needs the target absent
    out_dir.rename(old)
    try:
        tmp.rename(out_dir)
    except BaseException:
        old.rename(out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
