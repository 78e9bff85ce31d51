"""The files of the controller's CA: the lock every change holds, the
sharing of the CA through a PostgreSQL store, the ``issued.json`` book and
the directories made on the way (see :mod:`mccloud.pki` for the layout).

Several controllers sharing a PostgreSQL store (:func:`share`) share one
CA through it: the CA's certificate, its key and ``issued.json`` are kept
in the database too (table ``shared_files``), sealed under the store's key
(``<ssl_dir>/mccloud-store.key``, which stays on the controllers: the
operator copies it to each, as the CA itself), and every operation runs
inside one database transaction that holds their lock. It first brings
the files here up to the database's (a controller that finds the database
without them puts its own there: the first controller's CA becomes every
controller's), then writes back, in that transaction, what it changed. So
every controller serves certificates of the same CA, and none is issued
twice at once. ``custom/`` stays each controller's own.

Several processes may ask at once: every change happens under one
exclusive ``flock`` on ``<ssl_dir>/.lock``, and every file is written to a
temporary file in its directory, fsynced, then renamed over the old one, so
no reader sees half a file and a crash leaves the previous state (a batch of
certificates is one write of ``issued.json``: all of it, or none).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from mccloud import InvalidInputError, _native
from mccloud.durable import TMP_SUFFIX as _TMP_SUFFIX
from mccloud.durable import write as _write

if TYPE_CHECKING:
    from mccloud.pki import CA

log = logging.getLogger("mccloud.pki")

#: The settings (pillar keys) errors name.
SETTINGS = "makina-states.cloud"
#: The directory of operators' certificates, beside the CA's.
CUSTOM = "custom"
_LOCK = ".lock"
#: The file of the certificates a CA issued, in its directory.
ISSUED = "issued.json"


def _book_path(ca: CA) -> Path:
    return ca.cert_path.parent / ISSUED


def _read_book(ca: CA) -> dict[str, Any]:
    """``{domain: entry}`` of ``issued.json``; an unreadable file is logged
    and counts as empty (what it held is issued again, then replaces it)."""
    path = _book_path(ca)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): the certificates it held are issued again", path, exc)
        return {}
    certs = data.get("certs") if isinstance(data, dict) else None
    if not isinstance(certs, dict):
        log.warning("%s holds no certificates map: the certificates it held are issued again", path)
        return {}
    return certs


def _write_book(ca: CA, book: Mapping[str, Any]) -> None:
    data = json.dumps({"format": 1, "certs": book}, separators=(",", ":"), sort_keys=True)
    _write(_book_path(ca), data.encode(), 0o600)


def _custom_names(ssl_dir: Path) -> set[str]:
    """The file names in the directory of operators' certificates."""
    return _file_names(ssl_dir / CUSTOM)


def _file_names(folder: Path) -> set[str]:
    """The names in ``folder`` (none if it is missing)."""
    try:
        return set(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _tighten(path: Path, mode: int) -> None:
    """Takes from ``path`` any permission beyond ``mode`` (it must exist)."""
    with contextlib.suppress(FileNotFoundError):
        current = path.stat().st_mode & 0o777
        if current & ~mode:
            os.chmod(path, current & mode)
            log.warning("%s was mode %o: made %o", path, current, current & mode)


def _mkdir(path: Path) -> None:
    """``path`` and missing parents; the ones made here are 0700."""
    if path.is_dir():
        return
    _mkdir(path.parent)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)


#: ``ssl_dir`` -> the PostgreSQL store its CA is shared through, and the key
#: file its files are sealed with there.
_SHARED: dict[str, tuple[str, str]] = {}
#: The key file of the store's secrets, in ``ssl_dir`` unless set elsewhere
#: (``mccloud_store_key``); it is never shared through the store.
KEY_FILE = "mccloud-store.key"
#: The files of a CA directory that are shared.
_SHARED_FILES = ("{name}_ca_cert.crt", "{name}_ca_cert.key", ISSUED)


def share(ssl_dir: str | os.PathLike[str], store: str, key: str | None = None) -> None:
    """Shares the CA under ``ssl_dir`` through the PostgreSQL store ``store``
    (a connection string) from now on, in this process, its files sealed in
    the database with the key file ``key`` (default: ``<ssl_dir>/mccloud-store.key``,
    the store's own key)."""
    _SHARED[str(Path(ssl_dir))] = (store, key or str(Path(ssl_dir) / KEY_FILE))


def _shared_names(root: Path) -> dict[str, bytes]:
    """``{"<ca>/<file>": bytes}`` of the shared files under ``root``."""
    out = {}
    with contextlib.suppress(OSError), os.scandir(root) as top:
        for entry in top:
            if not entry.is_dir(follow_symlinks=False) or entry.name == CUSTOM or entry.name.startswith("."):
                continue
            for pattern in _SHARED_FILES:
                name = pattern.format(name=entry.name)
                with contextlib.suppress(FileNotFoundError):
                    out[f"{entry.name}/{name}"] = (root / entry.name / name).read_bytes()
    return out


def _pull(root: Path, session: Any) -> dict[str, bytes]:
    """Brings the shared files under ``root`` up to the database's (only
    those whose digest differs are read); returns the database's digests."""
    held: dict[str, bytes] = session.digests()
    for name, digest in held.items():
        ca_name, _, file_name = name.partition("/")
        if (not ca_name or ca_name.startswith(".") or ca_name == CUSTOM
                or file_name not in {p.format(name=ca_name) for p in _SHARED_FILES}):
            log.warning("shared file %r of the store is not one of a CA: ignored", name)
            continue
        path = root / ca_name / file_name
        with contextlib.suppress(FileNotFoundError):
            if hashlib.sha256(path.read_bytes()).digest() == digest:
                continue
        content = session.content(name)
        if content is None:
            continue
        _mkdir(path.parent)
        _write(path, content, 0o644 if file_name.endswith(".crt") else 0o600)
    return held


@contextlib.contextmanager
def _shared(root: Path) -> Iterator[None]:
    """The shared files' transaction around a change under ``root`` (see
    the module's documentation); nothing when the CA is not shared."""
    shared = _SHARED.get(str(root))
    if shared is None:
        yield
        return
    session = _native.SharedFiles(*shared)
    try:
        held = _pull(root, session)
        yield
        mine = _shared_names(root)
        session.commit({n: b for n, b in mine.items() if held.get(n) != hashlib.sha256(b).digest()})
    finally:
        session.close()


@contextlib.contextmanager
def _locked(ssl_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Holds the exclusive lock of ``ssl_dir`` (and, when its CA is shared,
    the shared files' transaction); temporary files a killed writer left
    behind are removed first (nobody else can be writing)."""
    root = Path(ssl_dir)
    if not root.is_absolute():
        raise InvalidInputError(f"{SETTINGS}.ssl_pillar_dir {str(root)!r} is not an absolute path: use one such as"
                                " /srv/pillar/cloud-controller/ssl")
    _mkdir(root)
    fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for stale in _stale_temporaries(root):
            stale.unlink(missing_ok=True)
        with _shared(root):
            yield
    finally:
        os.close(fd)


def _stale_temporaries(root: Path) -> Iterator[Path]:
    """Temporary files left in the directories this module writes:
    ``root``, each CA directory and its ``certs``."""
    folders = [root]
    with contextlib.suppress(OSError), os.scandir(root) as top:
        for entry in top:
            if entry.is_dir(follow_symlinks=False) and entry.name != CUSTOM:
                folders += [Path(entry.path), Path(entry.path) / "certs"]
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as it:
            for entry in it:
                if entry.name.startswith(".") and entry.name.endswith(_TMP_SUFFIX):
                    yield Path(entry.path)
