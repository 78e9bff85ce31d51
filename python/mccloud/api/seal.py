"""Sealing a password to the caller's public key: what a verb returns
travels on the master's event bus and lands in its job cache, both
readable by others (salt-api's ``/events`` streams the bus to any logged-in
user), so a password leaves the runner only encrypted with RSA-OAEP
(SHA-256) to a key only the caller holds (the page makes one with
WebCrypto for each read)."""

from __future__ import annotations

import base64
import binascii

from mccloud.api.envelope import BadRequest

#: The smallest RSA key accepted.
MIN_BITS = 2048


def seal(secret: str, pubkey: str) -> str:
    """``secret`` encrypted with RSA-OAEP-SHA256 to ``pubkey`` (base64 of a
    DER SubjectPublicKeyInfo, or a PEM public key), as base64."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    text = pubkey.strip() if isinstance(pubkey, str) else ""
    if not text:
        raise BadRequest("pubkey is empty: pass the base64 SubjectPublicKeyInfo (SPKI) of an RSA key")
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode("".join(text.split()), validate=True))
    except (ValueError, binascii.Error, TypeError) as exc:
        raise BadRequest(f"pubkey is not an RSA public key as base64 SPKI (DER) or PEM: {exc}") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise BadRequest(f"pubkey is a {type(key).__name__}, not an RSA key: RSA-OAEP needs one")
    if key.key_size < MIN_BITS:
        raise BadRequest(f"pubkey is a {key.key_size}-bit RSA key: use at least {MIN_BITS} bits")
    sealed = key.encrypt(secret.encode(), padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()),
                                                        algorithm=hashes.SHA256(), label=None))
    return base64.b64encode(sealed).decode()
