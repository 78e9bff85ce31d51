"""The runner ``mc_cloud_api`` on the real master, end to end: as the
controller's root (local ``salt-run``, an admin) and as users
authenticated by the master's eauth ``file`` (the master checks their
password and ACL, then runs the runner for them with their ``__user__``):
through Salt's ``RunnerClient.cmd_sync``, as salt-api's runner client
does, and once through ``salt-run -a file``; on nsbox guests (network
namespaces: they provision in seconds).

alice (teama) sees her VMs only, is refused bob's (403 naming both) and
an admin verb, is told 404 for a VM that does not exist; she creates a VM
on the node her group owns (declared through the API, served to the
master by the ``mccloud`` ext_pillar) and destroys it (its declaration
goes too) through jobs she follows to their end; her password read is
sealed and journaled with her name; bob cannot follow her job, nor create
VMs on her group's node, and destroys his own VM while she destroys hers."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Iterator

import pytest

from tests.integration.conftest import API_USERS, Cloud, last_json
from tests.integration.test_nsbox_driver import clean_up, nsbox_pillar
from tests.support.net import ssh_banner

#: alice's VM of the pillar files, bob's, and the one alice creates through the API.
MINE, THEIRS, NEW = "a1.api.lan", "b1.api.lan", "a2.api.lan"


@pytest.fixture(scope="module")
def api(cloud: Cloud) -> Iterator[Cloud]:
    pillar = nsbox_pillar(cloud)
    pillar[f"makina-states.cloud.nsbox.vms.{cloud.node}"] = {MINE: {"owners": ["teama"]},
                                                             THEIRS: {"owners": "teamb"}}
    pillar[f"makina-states.cloud.compute_node.conf.{cloud.node}"]["owners"] = ["teama"]
    cloud.set_vms({}, **pillar)
    rc, data, out = cloud.run("mc_cloud_controller.deploy")
    assert rc == 0 and data["result"] is True, out
    yield cloud
    # Nothing left for the next modules (the test destroys both; a failed one may not have).
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"]
    for vm in (MINE, THEIRS, NEW):
        if vm in held:
            cloud.run("mc_cloud_vm.destroy", vm)
    clean_up(cloud, (MINE, THEIRS, NEW))
    cloud.set_vms({})


def as_user(cloud: Cloud, user: str | None, verb: str, *args: str, **kwargs: Any) -> dict[str, Any]:
    """``mc_cloud_api.<verb>``: as root (``user`` None: the local
    ``salt-run``, positional ``args``), else through the master's eauth as
    ``user`` (``kwargs``). Returns the envelope."""
    if user is None:
        ret = cloud.run_cli.run(f"mc_cloud_api.{verb}", *args, *(f"{k}={v}" for k, v in kwargs.items()))
        envelope = last_json(ret.stdout)
        assert isinstance(envelope, dict) and "status" in envelope, ret.stdout + ret.stderr
        assert (ret.returncode == 0) == envelope["ok"], (ret.returncode, envelope)  # salt-run exits 1 on a failure
        return envelope
    low = {"fun": f"mc_cloud_api.{verb}", "arg": list(args), "kwarg": kwargs, "eauth": "file", "username": user,
           "password": API_USERS[user][0]}
    envelope = runner_client(cloud).cmd_sync(low, timeout=60)
    assert isinstance(envelope, dict) and "status" in envelope, envelope
    return envelope


def runner_client(cloud: Cloud) -> Any:
    """Salt's RunnerClient of the master's configuration as salt-api reads it (its runner client)."""
    if not hasattr(cloud, "api_client"):
        import salt.config
        import salt.runner

        opts = salt.config.api_config(cloud.master.config_file)
        cloud.api_client = salt.runner.RunnerClient(opts)  # type: ignore[attr-defined]
    return cloud.api_client  # type: ignore[attr-defined]


def follow(cloud: Cloud, user: str, job: str, secs: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + secs
    while True:
        got = as_user(cloud, user, "job", id=job)
        assert got["ok"], got
        if got["data"]["state"] != "running" or time.monotonic() > deadline:
            return dict(got["data"])
        time.sleep(0.5)


def test_users_see_and_act_on_their_vms_only(api: Cloud) -> None:
    cloud = api
    # alice creates a VM through the API (its job runs while the rest is checked).
    assert as_user(cloud, "bob", "provision", name="b2.api.lan", node=cloud.node)["status"] == 403
    started = as_user(cloud, "alice", "provision", name=NEW, node=cloud.node)
    assert started["status"] == 202, started
    job_id = started["data"]["job"]
    assert as_user(cloud, "alice", "provision", name=NEW)["status"] == 409  # busy: one job at a time
    assert as_user(cloud, "bob", "job", id=job_id)["status"] == 403

    root = as_user(cloud, None, "whoami")["data"]
    assert root["admin"] is True and "link_node" in root["verbs"], root
    assert {v["name"] for v in as_user(cloud, None, "vms")["data"]} == {MINE, THEIRS, NEW}
    assert as_user(cloud, None, "vm", "nope.api.lan")["status"] == 404

    alice = as_user(cloud, "alice", "whoami")["data"]
    assert alice == {"user": "alice", "groups": ["teama"], "admin": False, "verbs": alice["verbs"]}
    assert "link_node" not in alice["verbs"]
    assert [v["name"] for v in as_user(cloud, "alice", "vms")["data"]] == [MINE, NEW]
    assert [n["name"] for n in as_user(cloud, "alice", "nodes")["data"]] == [cloud.node]
    assert [v["name"] for v in as_user(cloud, "bob", "vms")["data"]] == [THEIRS]

    refused = as_user(cloud, "alice", "vm", name=THEIRS)
    assert (refused["status"], refused["error"]) == (403, "forbidden"), refused
    assert "alice" in refused["reason"] and THEIRS in refused["reason"] and "teamb" in refused["reason"]
    assert as_user(cloud, "alice", "destroy", name=THEIRS)["status"] == 403
    assert as_user(cloud, "alice", "vms", owner="teamb")["status"] == 403
    assert as_user(cloud, "alice", "vm", name="nope.api.lan")["status"] == 404
    assert as_user(cloud, "alice", "link_node", name="n2.api.lan", ip="192.0.2.2")["status"] == 403
    assert as_user(cloud, "alice", "vm", name=MINE, colour="blue")["status"] == 400
    # The same through salt-run's own eauth path.
    ret = cloud.run_cli.run("-a", "file", "--username", "bob", "--password", API_USERS["bob"][0],
                            "mc_cloud_api.vm", MINE)
    assert last_json(ret.stdout)["status"] == 403 and "bob" in last_json(ret.stdout)["reason"], ret.stdout

    # ssh keys go through the VM's own minion: an nsbox guest has none; a bad key is refused first.
    key_line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb1QvVfGd2N4u3Xy1kTfW3P6m1x0v6c7b9Yk2Jq0Rz8 alice@laptop"
    no_minion = as_user(cloud, "alice", "add_ssh_key", name=MINE, key=key_line)
    assert no_minion["status"] == 409 and "not a minion" in no_minion["reason"], no_minion
    assert as_user(cloud, "alice", "add_ssh_key", name=MINE, key='command="sh" ' + key_line)["status"] == 400
    # DNS names of a VM the pillar files declare are added there.
    pillar_dns = as_user(cloud, "alice", "link_dns", name=MINE, dns="www.api.lan")
    assert pillar_dns["status"] == 409 and "pillar" in pillar_dns["reason"], pillar_dns
    # Storage says what the guest's backing allows.
    assert as_user(cloud, "alice", "storage", name=MINE)["ok"]
    assert as_user(cloud, "alice", "storage", name=MINE, action="add", size="1g")["status"] == 501

    job = follow(cloud, "alice", job_id)
    assert job["state"] == "succeeded", job
    assert job["user"] == "alice" and any("mc_cloud_vm.provision" in m["text"] for m in job["messages"]), job
    row = as_user(cloud, "alice", "vm", name=NEW)["data"]
    assert (row["declared_by"], row["owners"], row["state"]) == ("api", ["teama"], "allocated"), row
    assert row["ssh"]["command"] == f"ssh -p {row['ssh']['port']} root@{cloud.node}", row
    assert ssh_banner(row["ip"], 22) == f"SSH-2.0-nsbox {NEW}\r\n".encode()
    assert ssh_banner("127.0.0.1", row["ssh"]["port"]) == f"SSH-2.0-nsbox {NEW}\r\n".encode()
    assert [j["id"] for j in as_user(cloud, "alice", "jobs")["data"]][0] == job_id
    assert job_id not in [j["id"] for j in as_user(cloud, "bob", "jobs")["data"]]

    # Her password, sealed to her key; the journal names her, never the value.
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    spki = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    assert as_user(cloud, "alice", "password", name=NEW)["status"] == 400
    sealed = as_user(cloud, "alice", "password", name=NEW, pubkey=spki)["data"]["sealed"]
    clear = key.decrypt(base64.b64decode(sealed), padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()),
                                                               algorithm=hashes.SHA256(), label=None)).decode()
    assert clear == cloud.call_cli.run("mc_cloud.inventory").data[cloud.node]["vms"][NEW]["password"]
    # Not in clear for the local root either (a runner's return goes on the event bus): it is told where to read it.
    local = as_user(cloud, None, "password", NEW)
    assert local["status"] == 400 and f"mccloud inventory --vm {NEW}" in local["reason"], local
    assert clear not in json.dumps(local)

    # bob's VM stayed through all of alice's refusals; each destroys their own, at the same time.
    assert as_user(cloud, "bob", "vm", name=THEIRS)["ok"]
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"]
    assert {MINE, THEIRS, NEW} <= set(held), held
    destroys = [("alice", as_user(cloud, "alice", "destroy", name=NEW)["data"]["job"]),
                ("alice", as_user(cloud, "alice", "destroy", name=MINE)["data"]["job"]),
                ("bob", as_user(cloud, "bob", "destroy", name=THEIRS)["data"]["job"])]
    for user, destroy_job in destroys:
        done = follow(cloud, user, destroy_job)
        assert done["state"] == "succeeded", done
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"]
    assert not {MINE, THEIRS, NEW} & set(held), held
    # The VM made through the API is gone with its declaration; those of the files stay declared.
    assert as_user(cloud, "alice", "vm", name=NEW)["status"] == 404
    assert as_user(cloud, "alice", "vm", name=MINE)["data"]["state"] == "declared"

    audit = cloud.run("mc_cloud.audit", "limit=200")[2]
    assert clear not in audit
    for kind, vm, what in [("password_read", NEW, "root password"), ("api_refused", THEIRS, "destroy"),
                           ("api_call", NEW, job_id), ("declared", NEW, "alice")]:
        entries = journal(cloud, kind, vm)
        assert any(e["caller"] == "salt-api (alice; groups teama)" and what in json.dumps(e) for e in entries), \
            (kind, entries)


def journal(cloud: Cloud, kind: str, vm: str) -> list[dict[str, Any]]:
    """The journal's entries of ``kind`` about ``vm``."""
    ret = cloud.run_cli.run("mc_cloud.audit", f"vm={vm}", f"kind={kind}")
    data = json.loads(ret.stdout)
    return list(data) if isinstance(data, list) else [data]
