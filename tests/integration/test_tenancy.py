"""A VM is a tenant, against a real master and minion: what every minion
of the master can read (publications, the job cache, the event bus) holds
no private key, and a VM named after another minion is refused before any
key is touched. Runs after the end-to-end test, whose bootstraps (each
carrying a VM's private minion key) are in the same master's job cache."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import NET, Cloud

pytestmark = pytest.mark.slow

VMS = {"vm1.test.lan": {"domains": ["*.shared.lan", "one.lan"]},
       "vm2.test.lan": {"ip": f"{NET}.50", "domains": ["*.shared.lan"]}}
SECRET_MARKS = ("PRIVATE KEY", "mccloud_private")


def published(cloud: Cloud, fun: str, *args: str) -> tuple[Any, list[Any]]:
    """Runs ``salt-run fun args`` and returns its result and every event
    the master's bus carried meanwhile (publications included: a
    ``salt/job/<jid>/new`` event holds what every minion receives)."""
    from mccloud import saltcompat

    events: list[Any] = []
    stop = threading.Event()
    ready = threading.Event()

    def listen() -> None:
        with saltcompat.master_event_bus(cloud.master.config) as bus:
            ready.set()
            while not stop.is_set():
                ev = bus.get_event(full=True, wait=0.2)
                if ev:
                    events.append(ev)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        rc, data, out = cloud.run(fun, *args)
        assert rc == 0 and data["result"] is True, out
    finally:
        stop.set()
        thread.join(30)
    return data, events


def test_no_private_key_in_publications_the_job_cache_or_the_event_bus(cloud: Cloud) -> None:
    import salt.payload

    cloud.set_vms(VMS)
    _, events = published(cloud, "mc_cloud_compute_node.deploy", cloud.node)
    jobs = [e for e in events if str(e.get("tag", "")).endswith("/new") and e["data"].get("fun") == "state.sls"]
    assert jobs, "the deploy published its state.sls jobs"
    for job in jobs:
        text = repr(job["data"])
        assert not any(mark in text for mark in SECRET_MARKS), text[:2000]
        assert "mccloud_job" in text, "the publication carries the token only"
    # The node did receive its certificates' keys (in its own pillar).
    pushed = cloud.call_cli.run("mc_cloud_compute_node.cn_settings").data
    assert any("PRIVATE KEY" in pem for _, pem in pushed["cnSettings"]["cn"]["ssl_certs"])
    assert not any(mark in repr(events) for mark in ("PRIVATE KEY",))
    # The job cache: every publication this master kept, and everything of
    # the state.sls jobs (returns included), the end-to-end test's
    # bootstraps (each with a VM's minion key) among them. A salt-call an
    # operator runs on a minion (cmd _return, as this test's cn_settings) is
    # that operator's own output, not a publication.
    cache = Path(cloud.master.config["cachedir"]) / "jobs"
    loads = list(cache.rglob(".load.p"))
    assert loads, f"no job in the master's job cache {cache}"
    states = 0
    for path in loads:
        load = salt.payload.loads(path.read_bytes())
        if load.get("cmd") == "_return":
            continue
        files = list(path.parent.rglob("*.p")) if load.get("fun") == "state.sls" else [path]
        states += load.get("fun") == "state.sls"
        for f in files:
            text = repr(salt.payload.loads(f.read_bytes()))
            assert not any(mark in text for mark in SECRET_MARKS), (f, text[:2000])
    assert states, "the state.sls jobs are in the job cache"


@pytest.mark.parametrize("name", ["node", "controller"])
def test_a_vm_named_after_another_minion_is_refused_before_any_key_is_touched(cloud: Cloud, name: str) -> None:
    import salt.key

    other = cloud.node if name == "node" else "mccloud-controller.test"
    keys = salt.key.get_key(cloud.master.config)
    before = keys.list_keys()
    pub = Path(cloud.master.config["pki_dir"]) / "minions" / cloud.node
    fingerprint = pub.read_text()
    cloud.set_vms({**VMS, other: {}}, **{"makina-states.cloud.master": "mccloud-controller.test"})
    rc, data, out = cloud.run("mc_cloud_vm.provision", other)
    assert rc != 0 and "take over its Salt key" in out, out
    assert keys.list_keys() == before
    assert pub.read_text() == fingerprint
    cloud.set_vms(VMS)
