"""Files replaced whole and made durable: a reader sees the old file or
the new one, never half of one, and a crash leaves one of the two."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

#: The suffix of temporary files (``.<name>.<random>.part`` beside the target).
TMP_SUFFIX = ".part"


def write(path: Path, data: bytes, mode: int) -> None:
    """Replaces ``path`` by ``data`` at once: temporary file (created 0600)
    in the same directory, fsynced, renamed, directory fsynced."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_many(files: list[tuple[Path, bytes, int]]) -> None:
    """Replaces each ``(path, data, mode)`` like :func:`write`, in order,
    with one sync of the filesystem for all the temporary files (before any
    rename) and one fsync per directory (after)."""
    temps: list[tuple[str, Path]] = []
    try:
        for path, data, mode in files:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                os.fchmod(out.fileno(), mode)
        _syncfs(files[0][0].parent)
        for tmp, path in temps:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for folder in dict.fromkeys(path.parent for path, _, _ in files):
        _fsync_dir(folder)


def _syncfs(path: Path) -> None:
    """Makes everything written on the filesystem of ``path`` durable
    (syncfs(2); sync(2) where libc has no syncfs)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _LIBC is not None and _LIBC.syncfs(fd) == 0:
            return
        os.sync()
    finally:
        os.close(fd)


def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc if hasattr(libc, "syncfs") else None
    except OSError:
        return None


_LIBC = _libc()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
