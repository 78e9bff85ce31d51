"""Checking an ssh public key a caller asks to install: one line ``TYPE
BASE64 [COMMENT]``, a known type, base64 whose first field repeats the
type, no options (``command=``, ``from=``: an ``authorized_keys`` line
could otherwise run anything) and nothing that could break the file (new
lines, NUL)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from typing import NamedTuple

from mccloud.api.envelope import BadRequest

TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
         "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
#: A user name ssh.set_auth_key may be given (POSIX portable names).
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
COMMENT = re.compile(r"^[A-Za-z0-9@._+=:,/-][A-Za-z0-9@._+=:,/ -]{0,199}$")


class PublicKey(NamedTuple):
    type: str
    blob: str
    comment: str

    @property
    def fingerprint(self) -> str:
        """``SHA256:...`` as ``ssh-keygen -l`` shows it."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse(key: object) -> PublicKey:
    """``key`` checked (see the module); a :class:`BadRequest` says what is wrong."""
    if not isinstance(key, str) or not key.strip():
        raise BadRequest("key is empty: pass one public key line, such as the content of ~/.ssh/id_ed25519.pub")
    text = key.strip()
    if any(c in text for c in "\r\n\0"):
        raise BadRequest("key holds more than one line: pass exactly one public key")
    parts = text.split(None, 2)
    if parts[0] not in TYPES:
        raise BadRequest(f"key must start with its type ({', '.join(TYPES)}), not {parts[0][:40]!r}: options "
                         "(command=, from=...) are not accepted")
    if len(parts) < 2:
        raise BadRequest("key has a type but no base64 key data")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        (size,) = struct.unpack(">I", blob[:4])
        inner = blob[4:4 + size].decode()
    except (binascii.Error, ValueError, struct.error, UnicodeDecodeError):
        raise BadRequest("key data is not valid base64 of an ssh public key") from None
    if inner != parts[0]:
        raise BadRequest(f"key says it is {parts[0]} but its data is a {inner[:40]!r} key")
    comment = parts[2].strip() if len(parts) > 2 else ""
    if comment and not COMMENT.match(comment):
        raise BadRequest("key comment may hold only letters, digits, spaces and @._+=:,/- (200 at most)")
    return PublicKey(parts[0], parts[1], comment)


def check_user(user: object) -> str:
    """The account the key is for, checked."""
    if not isinstance(user, str) or not USER.match(user):
        raise BadRequest(f"user must be a Unix account name (lower case letters, digits, _.-), not {user!r}")
    return user
