"""The directory of the certificates a compute node's haproxy serves by SNI,
written in one state whatever the number of domains.

.. code-block:: yaml

    mccloud-haproxy-certs:
      mccloud_certs.directory:
        - name: /etc/ssl/cloud/certs
        - pillar: mccloud:ssl_certs
        - keep: [haproxy.pem]

Pillar ``pillar`` holds ``[[domain, pem], ...]`` (certificate then key, as
``mc_cloud_compute_node.get_settings_for_target`` gives them in
``ssl_certs``). Each becomes ``<domain>.crt`` (a wildcard's ``*`` written
``_star``), mode 0600, replaced whole and only when it differs; the files
are made durable with one filesystem sync, not one per file. Files of
domains no longer served are removed, but for ``keep`` and the marker.

The directory must be mccloud's own: marked by its ``.mccloud-certs``
file, or empty. One holding files of others (``/etc/ssl/certs`` and its CA
bundle, say) is refused and left as it is. Certificates and keys never
appear in the state's return: changes list domain file names only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mccloud import durable as _durable
from mccloud import pki as _pki
from mccloud import saltcompat as _saltcompat

__virtualname__ = "mccloud_certs"

#: The file that marks a directory as mccloud's own.
MARKER = ".mccloud-certs"
MARKER_TEXT = b"The certificates haproxy serves, written by mccloud: this directory is its own.\n"
_MISSING = object()


class CertsDirError(Exception):
    """The certificates or their directory cannot be used."""


def __virtual__() -> str:
    return __virtualname__


def _wanted(name: str, pillar: str) -> dict[str, bytes]:
    """``{file name: contents}`` from pillar ``pillar``, checked."""
    got = _saltcompat.pillar_get(__salt__, pillar, _MISSING)  # type: ignore[name-defined]  # noqa: F821
    if got is _MISSING:
        raise CertsDirError(f"pillar {pillar} is missing: it holds the certificates to write in {name}")
    if not isinstance(got, (list, tuple)):
        raise CertsDirError(f"pillar {pillar} is not a list of [domain, pem] pairs")
    out: dict[str, bytes] = {}
    for i, pair in enumerate(got):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise CertsDirError(f"pillar {pillar}:{i} is not a [domain, pem] pair of strings")
        domain, pem = pair
        try:
            checked = _pki.validate_domain(domain)
        except ValueError as exc:
            raise CertsDirError(f"pillar {pillar}:{i}: {exc}") from None
        out[_pki.file_stem(checked) + ".crt"] = pem.encode()
    return out


def _own(folder: Path, keep: set[str]) -> list[str]:
    """The entries of ``folder``, refused when it is not mccloud's own."""
    entries = sorted(os.listdir(folder))
    if entries and MARKER not in entries:
        shown = ", ".join(entries[:3])
        raise CertsDirError(
            f"{folder} holds files mccloud did not write ({shown}): mccloud empties it of certificates it no "
            "longer serves, so it must be a directory of its own (such as /etc/ssl/cloud/certs)")
    return [e for e in entries if e != MARKER and e not in keep]


def directory(name: str, pillar: str, keep: Any = None, **kwargs: Any) -> dict[str, Any]:
    """``name`` holds exactly the certificates of pillar ``pillar`` (and
    ``keep``, names of files left alone), 0700, marked as mccloud's own."""
    ret: dict[str, Any] = {"name": name, "result": True, "comment": "", "changes": {}}
    test = bool(__opts__.get("test"))  # type: ignore[name-defined]  # noqa: F821
    try:
        folder = Path(name)
        if not folder.is_absolute():
            raise CertsDirError(f"{name} is not an absolute path")
        kept = {str(k) for k in (keep or []) if k}
        wanted = _wanted(name, pillar)
        present = folder.is_dir()
        others = _own(folder, kept) if present else []
        write: list[tuple[Path, bytes, int]] = []
        for file, data in wanted.items():
            try:
                same = (folder / file).read_bytes() == data
            except OSError:
                same = False
            if not same:
                write.append((folder / file, data, 0o600))
        if not present or not (folder / MARKER).is_file():
            write.insert(0, (folder / MARKER, MARKER_TEXT, 0o600))
        remove = [e for e in others if e not in wanted]
        loose = present and folder.stat().st_mode & 0o777 != 0o700
        changes: dict[str, Any] = {}
        if write:
            changes["written"] = [str(p.name) for p, _, _ in write]
        if remove:
            changes["removed"] = remove
        if loose or not present:
            changes["mode"] = "0700"
        if test:
            ret["result"] = None if changes else True
            ret["changes"] = changes
            ret["comment"] = (f"{name} would get {len(write)} file(s) written, {len(remove)} removed"
                              if changes else f"{name} is in the correct state")
            return ret
        if not present:
            folder.mkdir(mode=0o700, parents=True)
        os.chmod(folder, 0o700)
        if write:
            _durable.write_many(write)
        for entry in remove:
            (folder / entry).unlink(missing_ok=True)
        ret["changes"] = changes
        ret["comment"] = (f"{name}: {len(write)} file(s) written, {len(remove)} removed, {len(wanted)} served"
                          if changes else f"{name} is in the correct state ({len(wanted)} certificates)")
    except (CertsDirError, OSError) as err:
        ret["result"] = False
        ret["comment"] = str(err)
    return ret
