"""The runner ``mc_cloud_api`` on the real master, end to end: as the
controller's root (local ``salt-run``, an admin) and as users
authenticated by the master's eauth (``salt-run -a file``: the master runs
the runner for them with their ``__user__``, as it does for salt-api), on
nsbox guests (network namespaces: they provision in seconds).

alice (teama) sees her VM only, is refused bob's (403 naming both) and an
admin verb, is told 404 for a VM that does not exist; she provisions and
destroys her VM through jobs she follows to their end; her password read
is sealed and journaled with her name; bob cannot follow her job."""

from __future__ import annotations

import base64
import time
from typing import Any, Iterator

import pytest

from tests.integration.conftest import API_USERS, Cloud, last_json
from tests.integration.test_nsbox_driver import clean_up, nsbox_pillar
from tests.support.net import ssh_banner

MINE, THEIRS = "a1.api.lan", "b1.api.lan"


@pytest.fixture(scope="module")
def api(cloud: Cloud) -> Iterator[Cloud]:
    pillar = nsbox_pillar(cloud)
    pillar[f"makina-states.cloud.nsbox.vms.{cloud.node}"] = {MINE: {"owners": ["teama"]},
                                                             THEIRS: {"owners": "teamb"}}
    cloud.set_vms({}, **pillar)
    rc, data, out = cloud.run("mc_cloud_controller.deploy")
    assert rc == 0 and data["result"] is True, out
    yield cloud
    clean_up(cloud, (MINE, THEIRS))


def as_user(cloud: Cloud, user: str | None, verb: str, *args: str) -> dict[str, Any]:
    """``salt-run mc_cloud_api.<verb>``: as root (``user`` None), else
    through the master's eauth as ``user``. Returns the envelope."""
    auth = [] if user is None else ["-a", "file", "--username", user, "--password", API_USERS[user][0]]
    ret = cloud.run_cli.run(*auth, f"mc_cloud_api.{verb}", *args)
    envelope = last_json(ret.stdout)
    assert isinstance(envelope, dict) and "status" in envelope, ret.stdout + ret.stderr
    if user is None:  # the local salt-run exits non-zero on a failure
        assert (ret.returncode == 0) == envelope["ok"], (ret.returncode, envelope)
    return envelope


def follow(cloud: Cloud, user: str, job: str, secs: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + secs
    while True:
        got = as_user(cloud, user, "job", f"id={job}")
        assert got["ok"], got
        if got["data"]["state"] != "running" or time.monotonic() > deadline:
            return dict(got["data"])
        time.sleep(1)


def test_users_see_and_act_on_their_vms_only(api: Cloud) -> None:
    cloud = api
    root = as_user(cloud, None, "whoami")["data"]
    assert root["admin"] is True and "link_node" in root["verbs"], root
    assert {v["name"] for v in as_user(cloud, None, "vms")["data"]} == {MINE, THEIRS}

    alice = as_user(cloud, "alice", "whoami")["data"]
    assert alice == {"user": "alice", "groups": ["teama"], "admin": False, "verbs": alice["verbs"]}
    assert "link_node" not in alice["verbs"]
    assert [v["name"] for v in as_user(cloud, "alice", "vms")["data"]] == [MINE]
    assert [n["name"] for n in as_user(cloud, "alice", "nodes")["data"]] == [cloud.node]

    refused = as_user(cloud, "alice", "vm", THEIRS)
    assert (refused["status"], refused["error"]) == (403, "forbidden"), refused
    assert "alice" in refused["reason"] and THEIRS in refused["reason"] and "teamb" in refused["reason"]
    assert as_user(cloud, "alice", "destroy", THEIRS)["status"] == 403
    assert as_user(cloud, "alice", "vms", "owner=teamb")["status"] == 403
    assert as_user(cloud, "alice", "vm", "nope.api.lan")["status"] == 404
    assert as_user(cloud, "alice", "link_node", "n2.api.lan", "ip=192.0.2.2")["status"] == 403
    assert as_user(cloud, "alice", "vm", MINE, "colour=blue")["status"] == 400
    assert as_user(cloud, None, "vm", "nope.api.lan")["status"] == 404  # and salt-run exits 1

    # alice provisions her VM through a job, and follows it to its end.
    started = as_user(cloud, "alice", "provision", MINE)
    assert started["status"] == 202, started
    job_id = started["data"]["job"]
    assert as_user(cloud, "bob", "job", f"id={job_id}")["status"] == 403
    job = follow(cloud, "alice", job_id)
    assert job["state"] == "succeeded", job
    assert job["user"] == "alice" and any("mc_cloud_vm.provision" in m["text"] for m in job["messages"]), job
    row = as_user(cloud, "alice", "vm", MINE)["data"]
    assert row["ssh"]["command"] == f"ssh -p {row['ssh']['port']} root@{cloud.node}", row
    assert ssh_banner(row["ip"], 22) == f"SSH-2.0-nsbox {MINE}\r\n".encode()
    assert [j["id"] for j in as_user(cloud, "alice", "jobs")["data"]][0] == job_id
    assert job_id not in [j["id"] for j in as_user(cloud, "bob", "jobs")["data"]]

    # Her password, sealed to her key; the journal names her, never the value.
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    spki = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    assert as_user(cloud, "alice", "password", MINE)["status"] == 400
    sealed = as_user(cloud, "alice", "password", MINE, f"pubkey={spki}")["data"]["sealed"]
    clear = key.decrypt(base64.b64decode(sealed), padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()),
                                                               algorithm=hashes.SHA256(), label=None)).decode()
    assert clear == as_user(cloud, None, "password", MINE)["data"]["password"]
    audit = cloud.run("mc_cloud.audit", f"vm={MINE}", "kind=password_read")[2]
    assert "salt-api (alice; groups teama)" in audit and clear not in audit, audit
    refusals = cloud.run("mc_cloud.audit", f"vm={THEIRS}", "kind=api_refused")[2]
    assert "salt-api (alice; groups teama)" in refusals, refusals

    # Storage says what the guest's backing allows.
    assert as_user(cloud, "alice", "storage", MINE)["ok"]
    assert as_user(cloud, "alice", "storage", MINE, "action=add", "size=1g")["status"] == 501

    # bob's VM stays; alice destroys hers.
    done = follow(cloud, "alice", as_user(cloud, "alice", "destroy", MINE)["data"]["job"])
    assert done["state"] == "succeeded", done
    assert as_user(cloud, None, "vm", THEIRS)["ok"]
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"]
    assert MINE not in held
    journal = cloud.run("mc_cloud.audit", f"vm={MINE}", "kind=api_call")[2]
    assert job_id in journal and "salt-api (alice; groups teama)" in journal, journal
