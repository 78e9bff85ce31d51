"""Reads and writes under a VM's root filesystem, from the compute node,
that cannot be turned against the node.

The node writes into a container's root filesystem as root while the
container may run: the VM's root user can replace any directory there with
a symlink at any moment (pointing at ``/etc`` or ``/root`` of the node).
Checking the paths first and writing later leaves that window open. Here
every path is walked one component at a time from a descriptor of the
root, each opened with ``O_NOFOLLOW`` relative to the previous one, so a
symlink anywhere in the path is refused at the moment it is used. A file
is written as a new file beside its target, then renamed over it: a
symlink or a hard link planted at the target is replaced, never written
through.

New files and directories belong to the owner of the root directory (the
container's root, mapped or not); a file that is replaced keeps its owner,
group and mode unless a mode is given.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat as _stat
from collections.abc import Iterator
from contextlib import contextmanager

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RootfsError(Exception):
    """A path under a VM's root filesystem that cannot be used safely."""


def parts(rel: str) -> list[str]:
    """The components of ``rel``, a path inside the root (leading ``/``
    optional). ``.``, ``..``, empty components and NUL are refused."""
    if not isinstance(rel, str) or "\0" in rel:
        raise RootfsError(f"{rel!r} is not a path inside a VM's root filesystem")
    out = [p for p in rel.strip("/").split("/")]
    if not out or any(p in ("", ".", "..") for p in out):
        raise RootfsError(f"{rel!r} is not a path inside a VM's root filesystem "
                          "(no empty, '.' or '..' components)")
    return out


def _refusal(root: str, walked: list[str], err: OSError) -> RootfsError:
    where = os.path.join(root, *walked)
    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        return RootfsError(f"{where} is a symlink or not a directory: the VM could point it at the "
                           "node's files; refusing to write through it")
    return RootfsError(f"{where}: {err.strerror}")


@contextmanager
def _open_root(root: str) -> Iterator[int]:
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise RootfsError(f"the VM's root filesystem {root} cannot be opened: {err.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def opendir(root: str, dirparts: list[str], makedirs: bool = False, mode: int = 0o755) -> Iterator[int]:
    """A descriptor of ``root/<dirparts>``, walked without following any
    symlink; missing directories are made (``makedirs``) owned like the
    root."""
    with _open_root(root) as rfd:
        st = os.fstat(rfd)
        fd = os.dup(rfd)
        try:
            for i, name in enumerate(dirparts):
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not makedirs:
                        raise RootfsError(f"{os.path.join(root, *dirparts[:i + 1])} does not exist") from None
                    try:
                        try:
                            os.mkdir(name, mode, dir_fd=fd)
                            made = True
                        except FileExistsError:  # made meanwhile: opened below like any other
                            made = False
                        nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                        if made:
                            os.fchown(nfd, st.st_uid, st.st_gid)
                            os.fchmod(nfd, mode)
                    except OSError as err:
                        raise _refusal(root, dirparts[:i + 1], err) from None
                except OSError as err:
                    raise _refusal(root, dirparts[:i + 1], err) from None
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)


def _read_at(dfd: int, name: str) -> tuple[bytes, os.stat_result] | None:
    """The regular file ``name`` in ``dfd``; None when it is missing, a
    symlink or not a regular file (it is replaced, never read through)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EISDIR):
            return None
        raise
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def regular(root: str, rel: str) -> tuple[bytes, os.stat_result] | None:
    """The contents and status of the regular file ``root/rel``, read at
    once; None when it is missing, a symlink, not a regular file, or below
    a path that cannot be walked."""
    *dirs, name = parts(rel)
    try:
        with opendir(root, dirs) as dfd:
            return _read_at(dfd, name)
    except RootfsError:
        return None


def read(root: str, rel: str) -> bytes | None:
    """The contents of the regular file ``root/rel``, or None."""
    got = regular(root, rel)
    return got[0] if got else None


def write(root: str, rel: str, data: bytes, mode: int | None = None, makedirs: bool = True,
          owner: tuple[int, int] | None = None, dry_run: bool = False) -> bool:
    """Makes ``root/rel`` hold ``data``: written beside it, then renamed over
    it. The file keeps its owner, group and mode (or the mode given; new
    files: the root's owner, ``owner`` when given, mode 0644). False when it
    already held that (and that mode)."""
    *dirs, name = parts(rel)
    if dry_run and makedirs:
        try:
            with opendir(root, dirs):
                pass
        except RootfsError as err:
            if "does not exist" in str(err):
                return True
            raise
    with opendir(root, dirs, makedirs=makedirs and not dry_run) as dfd:
        old = _read_at(dfd, name)
        if old is not None:
            want_mode = _stat.S_IMODE(old[1].st_mode) if mode is None else mode
            if old[0] == data and _stat.S_IMODE(old[1].st_mode) == want_mode and (
                    owner is None or (old[1].st_uid, old[1].st_gid) == owner):
                return False
            uid, gid = owner or (old[1].st_uid, old[1].st_gid)
        else:
            want_mode = 0o644 if mode is None else mode
            if owner is None:
                with _open_root(root) as rfd:
                    rst = os.fstat(rfd)
                uid, gid = rst.st_uid, rst.st_gid
            else:
                uid, gid = owner
        if dry_run:
            return True
        tmp = f".{name}.mccloud-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
        except OSError as err:
            raise _refusal(root, [*dirs, tmp], err) from None
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchown(fd, uid, gid)
                os.fchmod(fd, want_mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as err:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise _refusal(root, [*dirs, name], err) from None
        return True


def directory(root: str, rel: str, mode: int, dry_run: bool = False) -> bool:
    """Makes ``root/rel`` a directory of mode ``mode`` (parents made as
    needed). False when it already was one of that mode."""
    names = parts(rel)
    try:
        with opendir(root, names) as fd:
            if _stat.S_IMODE(os.fstat(fd).st_mode) == mode:
                return False
            if not dry_run:
                os.fchmod(fd, mode)
            return True
    except RootfsError:
        if dry_run:
            return True
    with opendir(root, names, makedirs=True, mode=mode):
        return True
