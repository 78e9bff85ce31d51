"""Domain names as the CA sees them: which are accepted, the file a
domain's certificate is kept in, and which certificate serves which
domain (a wildcard covers one label more)."""

from __future__ import annotations

from typing import Any

from mccloud import ArgumentError, InvalidInputError, check_domain


class BadDomainError(ArgumentError, ValueError):
    """A domain that is no DNS name."""


def validate_domain(domain: Any) -> str:
    """``domain`` lower-cased, if it is a DNS host name, optionally a
    wildcard ``*.<at least two labels>``; :class:`BadDomainError` otherwise.
    The registry's own rule (:func:`mccloud.check_domain`): a domain the
    registry accepts is one a certificate is issued for."""
    if not isinstance(domain, str):
        raise BadDomainError(f"domain {domain!r} is not a string: give a DNS name such as vm1.example.com")
    if domain == "*":
        raise BadDomainError("domain '*' routes every host to one VM and has no certificate of its own")
    try:
        return check_domain(domain)
    except InvalidInputError as exc:
        advice = str(exc).rsplit(" is not a domain: ", 1)[-1]
        raise BadDomainError(f"domain {domain!r} is not a DNS name: {advice}") from None


def file_stem(domain: str) -> str:
    """The file name (without extension) of ``domain``'s certificate."""
    return domain.replace("*", "_star")


def wildcard_of(domain: str) -> str | None:
    """The wildcard covering ``domain`` (``*.foo.com`` for ``a.foo.com``), if any."""
    if domain.startswith("*.") or domain.count(".") < 2:
        return None
    return "*." + domain.split(".", 1)[1]


def domain_match(domain: str, cert_domain: str) -> bool:
    """Whether a certificate for ``cert_domain`` serves ``domain``: equal
    (ignoring case), or ``cert_domain`` is ``*.<parent>`` with at least two
    labels in the parent and ``domain`` has exactly one label more."""
    domain, cert_domain = domain.lower(), cert_domain.lower()
    if domain == cert_domain:
        return True
    parts, dparts = cert_domain.split("."), domain.split(".")
    return parts[0] == "*" and len(parts) == len(dparts) > 2 and parts[1:] == dparts[1:]
