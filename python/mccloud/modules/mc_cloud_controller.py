"""Cloud-controller settings, its certificate authority and the
certificates it issues for compute nodes and VM domains.

Certificates live under ``mc_cloud.settings()['ssl_pillar_dir']`` (layout
in :mod:`mccloud.pki`); the CA is made from ``mc_cloud.settings()['ssl']``.
"""

from __future__ import annotations

from typing import Any

import mccloud
import mccloud.pki as _pki
import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_controller"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """Controller settings (controller id, virtualisation types, ssh key).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.settings
    """
    return _ms.open_config(__opts__, __pillar__).controller_settings()


def gen_id(name):
    """Historical id mangling: replaces every ``.`` by ``-`` and nothing else.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.gen_id devhost10.local
    """
    return mccloud.gen_id(str(name))


def _ssl():
    """``(ssl_pillar_dir, ssl.ca settings, ssl.cert_days)``."""
    cfg = _ms.open_config(__opts__, __pillar__)
    cloud = cfg.cloud_settings()
    _ms.share_ca(__opts__, cfg, cloud["ssl_pillar_dir"])
    return cloud["ssl_pillar_dir"], cloud["ssl"]["ca"], cloud["ssl"]["cert_days"]


def _domain_list(domains: Any) -> list[Any]:
    if isinstance(domains, str):
        domains = [d.strip() for d in domains.split(",")]
    if not isinstance(domains, (list, tuple)) or not domains:
        raise mccloud.ArgumentError(
            f"domains {domains!r} is not a list of domains: give one such as a.example.com,b.example.com")
    return list(domains)


@_ms.salt_errors
def ensure_ca_present():
    """Creates the controller's certificate authority unless it exists;
    returns the path of its certificate.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.ensure_ca_present
    """
    ssl_dir, ca, _ = _ssl()
    return str(_pki.ensure_ca(ssl_dir, ca).cert_path)


@_ms.salt_errors
def get_cacert(as_text=False):
    """The path of the controller's CA certificate (created if missing), or
    its PEM text with ``as_text``: what clients must trust.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.get_cacert
        mastersalt-call mc_cloud_controller.get_cacert as_text=True
    """
    as_text = _ms.boolean("as_text", as_text)
    ssl_dir, ca, _ = _ssl()
    authority = _pki.ensure_ca(ssl_dir, ca)
    return authority.cert_pem if as_text else str(authority.cert_path)


@_ms.salt_errors
def get_cert_for(domain, gen=False, domain_csr_data=None):
    """``(certificate path, key path)`` for ``domain``: an operator's
    certificate under ``<ssl_pillar_dir>/custom`` (for the domain, else its
    wildcard), else the CA's. With ``gen`` the CA's is issued (again) when
    missing, expired or otherwise unusable; without, a missing one is an
    error. ``domain_csr_data`` overrides subject keys (C, ST, L, O, OU, CN,
    emailAddress) of a certificate issued now.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.get_cert_for vm1.example.com
        mastersalt-call mc_cloud_controller.get_cert_for vm1.example.com True
        mastersalt-call mc_cloud_controller.get_cert_for vm1.example.com gen=True domain_csr_data='{O: Example}'
    """
    gen = _ms.boolean("gen", gen)
    ssl_dir, ca, days = _ssl()
    files = _pki.find_cert(ssl_dir, domain, ca, days, gen=gen, subject=domain_csr_data)
    return str(files.cert_path), str(files.key_path)


@_ms.salt_errors
def search_matching_certificate(domain, as_text=False):
    """``(certificate, key)`` to serve ``domain`` (paths, or PEM texts with
    ``as_text``): a custom certificate, else the CA's, issued when needed.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.search_matching_certificate vm1.example.com
        mastersalt-call mc_cloud_controller.search_matching_certificate vm1.example.com as_text=True
    """
    as_text = _ms.boolean("as_text", as_text)
    ssl_dir, ca, days = _ssl()
    return _pki.cert_pairs(ssl_dir, [domain], ca, days, as_text=as_text)[0]


@_ms.salt_errors
def ssl_certs(domains, as_text=False):
    """``[(certificate, key)]`` serving ``domains`` (a list, or names
    separated by commas), issued when needed, each pair once (paths, or PEM
    texts with ``as_text``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.ssl_certs devhost10.local,vm1.example.com
        mastersalt-call mc_cloud_controller.ssl_certs '[devhost10.local, "*.example.com"]' as_text=True
    """
    as_text = _ms.boolean("as_text", as_text)
    ssl_dir, ca, days = _ssl()
    return _pki.cert_pairs(ssl_dir, _domain_list(domains), ca, days, as_text=as_text)


@_ms.salt_errors
def get_certs_dir():
    """The directory holding the certificates the CA issued.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.get_certs_dir
    """
    ssl_dir, ca, _ = _ssl()
    return str(_pki.certs_dir(ssl_dir, _pki.CASettings.parse(ca).name))


@_ms.salt_errors
def domain_match(domain, cert_domain):
    """Whether a certificate for ``cert_domain`` serves ``domain``: the same
    name, or a wildcard ``*.<parent>`` (parent of two labels or more) and
    ``domain`` one label below it.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.domain_match a.example.com '*.example.com'
    """
    return _pki.domain_match(str(domain), str(cert_domain))


@_ms.salt_errors
def is_certificate_matching_domain(cert_path, domain):
    """Whether the certificate file ``cert_path`` names ``domain`` in its
    common name or subjectAltName (wildcards allowed).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.is_certificate_matching_domain /srv/pillar/cloud-controller/ssl/custom/a.example.com.crt a.example.com
    """
    return _pki.matches(_pki.read_cert(str(cert_path)), str(domain))


@_ms.salt_errors
def load_certs(path):
    """The ``*.crt`` files of directory ``path`` indexed by common name and
    by subjectAltName: ``({cn: {cert, key}}, {alt name: {cert, key}})``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.load_certs /srv/pillar/cloud-controller/ssl/custom
    """
    return _pki.load_certs(str(path))
