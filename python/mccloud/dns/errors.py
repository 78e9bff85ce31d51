"""The error of a DNS publication, and the settings' names it points to."""

from __future__ import annotations

from typing import Any

from mccloud import MccloudError

#: The pillar prefix of the DNS settings, named by the errors.
PILLAR = "makina-states.cloud.dns"


class DnsError(MccloudError):
    """A publication, verification or comparison that could not be done:
    the message says what, where (the nameserver as ``host:port``, the
    zone) and what to check. It never holds the TSIG secret or the API key.

    ``result``, when changes had already been acknowledged by the primary
    before the failure (a later batch refused, a nameserver not verified),
    is the partial result in :func:`mccloud.dns.publish`'s form, so that the
    caller records what was published; otherwise None."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


def tsig_refused(key: str, where: str, rcode: str) -> DnsError:
    """The primary (or a nameserver) did not accept the key."""
    return DnsError(f"the TSIG key {key} was refused by {where} ({rcode}): check {PILLAR}.tsig")
