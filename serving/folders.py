"""What the model repository reads on disk: model folder names, the numbered version folders
inside one, and a version folder's signature (what changes when it is replaced or its files
rewritten). These run on every request, so each is one listing and no `stat` where the
directory entry already tells."""

import errno
import os
import re
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")  # a folder name, never a path

# What `Path.is_dir` takes for "not a folder": missing, a file on the way, a symlink loop.
NOT_A_FOLDER = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF)


def is_version(text: str) -> bool:
    """A version folder's name: ASCII digits only ("²" is a digit to `str.isdigit`)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def version_numbers(folder: str | Path) -> list[int] | None:
    """The sorted numbers of `folder`'s version folders; None if `folder` is not a folder
    (missing, a file, a symlink loop). Other errors (permissions) are raised."""
    try:
        with os.scandir(folder) as entries:
            return sorted(int(e.name) for e in entries if is_version(e.name) and _is_folder(e))
    except OSError as error:
        if error.errno not in NOT_A_FOLDER:
            raise
        return None


def folder_signature(folder: Path) -> tuple[object, ...] | None:
    """What changes when a version folder is replaced or its files rewritten: each file's
    identity, size and times (a few `stat`s per request; `None` once the folder is gone)."""
    try:
        with os.scandir(folder) as entries:
            files = sorted(
                (e.name, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
                for e in entries
                for s in [e.stat(follow_symlinks=False)]
            )
        return (folder.stat().st_ino, *files)
    except OSError:
        return None


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError as error:
        if error.errno not in NOT_A_FOLDER:
            raise
        return False
