"""Subordinate ids of a compute node (``/etc/subuid``, ``/etc/subgid``):
which host users own which ids, and root's line for the node's
unprivileged containers.

The files hold one ``owner:start:count`` a line (``owner`` a user name or
a numeric uid), with comments (``#``) and blank lines. A host user whose
range intersects the containers' ids could map them with ``newuidmap``
and own, signal or trace those containers: :func:`check` refuses that,
and a start inside the subordinate ids ``useradd`` hands to new users
(``SUB_UID_MIN``..``SUB_UID_MAX`` of ``/etc/login.defs``) unless allowed,
before anything is written. Root's line is the one starting at the
node's range start (the line mccloud writes): it is replaced when the
node grows; every other line is kept as it is.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

#: shadow's defaults when ``/etc/login.defs`` sets no ``SUB_UID_MIN``/``SUB_UID_MAX``.
LOGIN_DEFS_DEFAULTS = (100_000, 600_100_000)
#: The pillar key that allows a range inside ``useradd``'s subordinate ids.
ALLOW_KEY = "makina-states.cloud.compute_node.idmap_allow_login_defs_range"
#: The pillar keys of the node's id range.
RANGE_KEY = "makina-states.cloud.compute_node.idmap_range_start/_end"


class SubidError(ValueError):
    """A subordinate id file that cannot be read, or a range that must not
    be given to root; the message says what and what to do."""


@dataclass(frozen=True)
class Line:
    """One range of a subordinate id file: ``count`` ids from ``start``."""

    owner: str
    start: int
    count: int
    lineno: int

    @property
    def end(self) -> int:
        """The last id of the range (inclusive)."""
        return self.start + self.count - 1

    def text(self) -> str:
        return f"{self.owner}:{self.start}:{self.count}"


def parse(text: str, path: str) -> list[Line]:
    """The ranges of subordinate id file ``text`` (read from ``path``,
    named in errors); comments and blank lines skipped. A line that is not
    ``owner:start:count`` is refused: the range it hides cannot be
    checked."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
            raise SubidError(f"{path} line {n} ({line!r}) is not owner:start:count: fix or remove it, "
                             "the ids it may give cannot be checked")
        out.append(Line(parts[0], int(parts[1]), int(parts[2]), n))
    return out


def login_defs_range(text: str | None, kind: str) -> tuple[int, int]:
    """``SUB_UID_MIN``..``SUB_UID_MAX`` (``kind`` ``uid``) or the ``GID``
    pair of ``/etc/login.defs`` ``text`` (None: the file is absent), each
    falling back to shadow's default."""
    values: dict[str, int] = {}
    for raw in (text or "").splitlines():
        parts = raw.split()
        if len(parts) >= 2 and not parts[0].startswith("#") and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    low, high = LOGIN_DEFS_DEFAULTS
    k = kind.upper()
    return values.get(f"SUB_{k}_MIN", low), values.get(f"SUB_{k}_MAX", high)


def is_mine(line: Line, start: int) -> bool:
    """Whether ``line`` is root's line for a range starting at ``start``
    (the one mccloud writes)."""
    return line.owner == "root" and line.start == start


def check(lines: list[Line], start: int, count: int, path: str,
          login_defs: tuple[int, int], allow_login_defs: bool) -> None:
    """Whether root may hold ``count`` ids from ``start`` beside the
    ``lines`` of ``path``. Refused, naming the owner and the range, when
    another owner's range intersects
    ``start``..``start+count-1``; refused when that range reaches into
    ``useradd``'s subordinate ids ``login_defs`` unless
    ``allow_login_defs``."""
    end = start + count - 1
    low, high = login_defs
    if start <= high and end >= low and not allow_login_defs:
        raise SubidError(
            f"the containers' ids {start}-{end} ({RANGE_KEY}) lie inside the subordinate ids useradd hands "
            f"to new host users ({low}-{high}, SUB_UID_MIN..SUB_UID_MAX of /etc/login.defs): a user created "
            f"later could map them. Start the range above {high}, or set {ALLOW_KEY}: true if no user will "
            "ever get subordinate ids there")
    for other in lines:
        if other.owner == "root" or other.owner == "0":
            continue
        if other.start <= end and other.end >= start:
            raise SubidError(
                f"{path} line {other.lineno} gives {other.owner!r} ids {other.start}-{other.end}, which "
                f"intersect the containers' ids {start}-{end} ({RANGE_KEY}): {other.owner} could own those "
                f"containers' files and processes. Move {RANGE_KEY} off {other.start}-{other.end}, or "
                f"that user's range")


def render(text: str, lines: list[Line], start: int, count: int) -> str:
    """``text`` with root's line for ``start`` set to ``count`` ids: the
    line replaced in place (duplicates dropped), or appended; comments,
    blank lines and every other line kept as they are."""
    mine = f"root:{start}:{count}"
    out, placed = [], False
    by_lineno = {line.lineno: line for line in lines}
    for n, raw in enumerate(text.splitlines(), 1):
        line = by_lineno.get(n)
        if line is not None and is_mine(line, start):
            if not placed:
                out.append(mine)
            placed = True
            continue
        out.append(raw)
    if not placed:
        out.append(mine)
    return "\n".join(out) + "\n"


def read(path: str) -> str | None:
    """The text of ``path``, None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write(path: str, text: str) -> None:
    """Replaces ``path`` with ``text`` at once (mode 0644 for a new file,
    else the file's own)."""
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".mccloud-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ensure(path: str, start: int, count: int, login_defs_path: str, allow_login_defs: bool,
           dry_run: bool = False) -> tuple[bool, str]:
    """Gives root ``count`` ids from ``start`` in ``path`` (``/etc/subuid``
    or ``/etc/subgid``; the ``SUB_GID_*`` pair of ``login_defs_path``
    applies to the latter) after the checks of :func:`check`. Returns
    whether the file changes (``dry_run``: would change) and what
    happened. Raises :class:`SubidError`, writing nothing, when refused."""
    if count <= 0:
        return False, f"{path}: no unprivileged container needs ids, nothing to give root"
    text = read(path) or ""
    lines = parse(text, path)
    kind = "gid" if os.path.basename(path).endswith("gid") else "uid"
    check(lines, start, count, path, login_defs_range(read(login_defs_path), kind), allow_login_defs)
    new = render(text, lines, start, count)
    if new == text:
        return False, f"{path}: root holds {start}:{count}"
    if not dry_run:
        write(path, new)
    return True, f"{path}: root {'would hold' if dry_run else 'holds'} {start}:{count}"
