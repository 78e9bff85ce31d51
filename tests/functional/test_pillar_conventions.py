"""makina-states' pillar conventions and settings shapes through the real
``mastersalt-call``: the keys existing deployments read, ``-overrides``,
list extension, flat dotted keys, devhost mode and size profiles."""

from __future__ import annotations

from typing import Any

from tests.support.saltenv import SaltEnv

CLOUD = "makina-states.cloud"


def settings(salt_env: SaltEnv, fun: str, *args: str) -> Any:
    r = salt_env.mastersalt_call(fun, *args)
    assert r.returncode == 0, r.output
    return r.data


def test_cloud_settings_carry_the_original_keys_and_pillar_overrides(salt_env: SaltEnv) -> None:
    s = settings(salt_env, "mc_cloud.settings")
    assert (s["pvdir"], s["pfdir"]) == ("/etc/mastersalt/cloud.providers.d", "/etc/mastersalt/cloud.profiles.d")
    assert (s["all_sls_dir"], s["compute_node_sls_dir"], s["ssl_dir"]) == (
        "cloud-controller",
        "cloud-controller/compute_node",
        "cloud-controller/ssl",
    )
    assert s["ssl_pillar_dir"] == f"{salt_env.store_dir}/ssl"
    assert s["ssl"] == {
        "cert_days": 365000,
        "ca": {
            "ca_name": "controller", "bits": 2048, "days": 365000, "CN": "makina-states-cloud-controller",
            "C": "FR", "ST": "PdL", "L": "Nantes", "O": "Makina Corpus", "OU": None,
            "emailAddress": "contact@makina-corpus.com",
        },
    }
    salt_env.set_pillar({
        CLOUD: {"all_sls_dir": "cc", "ssl": {"ca": {"O": "Example"}}},
        f"{CLOUD}.ssl.ca.bits": 4096,
        f"{CLOUD}.prefix": "/etc/ms2",
    })
    s = settings(salt_env, "mc_cloud.settings")
    assert (s["ssl_dir"], s["pvdir"]) == ("cc/ssl", "/etc/ms2/cloud.providers.d")
    assert (s["ssl"]["ca"]["O"], s["ssl"]["ca"]["bits"], s["ssl"]["ca"]["C"]) == ("Example", 4096, "FR")


def test_bad_ca_settings_name_the_pillar_key(salt_env: SaltEnv) -> None:
    salt_env.set_pillar({f"{CLOUD}.ssl.ca.bits": 0})
    r = salt_env.mastersalt_call("mc_cloud.settings")
    assert r.returncode != 0 and "makina-states.cloud.ssl.ca.bits" in r.output and "above 0" in r.output
