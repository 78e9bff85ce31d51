"""The store's sealed secrets, opened the way the format is documented
(``mccloud-aead:v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>``,
ChaCha20-Poly1305, the row as associated data), independently of the
core: what the tests compare stored rows with."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

PREFIX = "mccloud-aead:v1:"


def key_file() -> Path:
    """The key file the tests' registries use (``$MCCLOUD_STORE_KEY``, set
    by the tests' session fixture)."""
    return Path(os.environ["MCCLOUD_STORE_KEY"])


def opened(stored: str | bytes, table: str, *row: str, key: Path | None = None) -> str:
    """The clear text of a value of ``table`` stored for ``row`` (node and
    VM, or a shared file's name); a value stored in clear as it is."""
    text = stored.decode() if isinstance(stored, bytes) else stored
    if not text.startswith(PREFIX):
        return text
    _, body = text[len(PREFIX):].split(":", 1)
    line = (key or key_file()).read_text().strip()
    raw = base64.b64decode(line.split(":")[-1])
    sealed = base64.b64decode(body)
    ad = "\0".join((table, *row)).encode()
    return ChaCha20Poly1305(raw).decrypt(sealed[:12], sealed[12:], ad).decode()
