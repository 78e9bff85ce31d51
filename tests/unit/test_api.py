"""The API's logic without Salt (``mccloud.api``): the envelope, who the
caller is (groups by map, the controller's local admin, LDAP without a
service account), ownership on a real registry (a VM's own owners, its
node's, refusals journaled), sealed passwords, ssh keys checked, jobs
(a real worker process: running, succeeded, failed, lost)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import mccloud
from mccloud import saltsupport
from mccloud.api import declarations, envelope, identity, jobs, seal, service, sshkey, worker
from tests.support.pillars import FLAGS

CN = "node1.test"
OTHER = "node2.test"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb1QvVfGd2N4u3Xy1kTfW3P6m1x0v6c7b9Yk2Jq0Rz8 alice@laptop"


def pillar() -> dict[str, Any]:
    return {
        **FLAGS,
        "makina-states.cloud.lxc.defaults.network": "10.9.0.0",
        "makina-states.cloud.lxc.defaults.netmask": "24",
        "makina-states.cloud.lxc.defaults.gateway": "10.9.0.1",
        f"makina-states.cloud.lxc.vms.{CN}": {"a1.test": {"owners": ["teama"]}, "a2.test": {"owners": "teama"},
                                               "b1.test": {"owners": ["teamb"]}, "n1.test": {}},
        f"makina-states.cloud.lxc.vms.{OTHER}": {"x1.test": {}},
        f"makina-states.cloud.compute_node.conf.{CN}": {"owners": ["ops"]},
    }


OPTS = {"user": "root", "mccloud_api": {"groups": "map", "admin_groups": ["cloud-admins"],
                                        "map": {"alice": ["teama"], "bob": ["teamb"], "carol": ["cloud-admins"],
                                                "olga": ["ops"]}}}


def api_opts(tmp_path: Path) -> dict[str, Any]:
    """A master's options for the API (its store in ``tmp_path``)."""
    return {**OPTS, "cachedir": str(tmp_path / "cache"), "mccloud_store_dir": str(tmp_path / "store"),
            "__role": "master", "id": "ctl_master"}


@pytest.fixture
def reg(tmp_path: Path) -> mccloud.Registry:
    ctx = {"minion_id": "ctl", "store_key": saltsupport.store_key(api_opts(tmp_path))}
    r = mccloud.Registry.open(ctx, pillar(), str(tmp_path / "store"), caller="test", controller=True)
    r.target_settings(CN)
    r.target_settings(OTHER)
    return r


def api(tmp_path: Path, reg: mccloud.Registry, user: str, **env: str) -> service.Api:
    """The API as the runner makes it: its own registry (the same store as
    ``reg``), opened with the caller's name, on the pillar the master serves."""
    return service.Api(api_opts(tmp_path), user, pillar=served_pillar(reg), environ=env)


def served_pillar(reg: mccloud.Registry) -> dict[str, Any]:
    """The controller's pillar as the master compiles it: the files', with
    what the ``mccloud`` ext_pillar adds from the API's declarations merged
    in (Salt merges mappings key by key)."""
    out = pillar()
    for key, value in reg.api_pillar()["keys"].items():
        old = out.get(key)
        out[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def call(tmp_path: Path, reg: mccloud.Registry, user: str, verb: str, **kw: Any) -> dict[str, Any]:
    try:
        return getattr(api(tmp_path, reg, user), verb)(**kw)  # type: ignore[no-any-return]
    except envelope.ApiError as exc:
        return envelope.failure(exc)


def test_envelopes() -> None:
    assert envelope.ok([1]) == {"ok": True, "status": 200, "data": [1]}
    assert envelope.started("j") == {"ok": True, "status": 202, "data": {"job": "j"}}
    assert envelope.failure(envelope.Forbidden("no")) == {"ok": False, "status": 403, "error": "forbidden",
                                                          "reason": "no"}
    assert envelope.failure(envelope.Unsupported("x"))["error"] == "unsupported"
    assert envelope.failure(envelope.Conflict("x"))["status"] == 409


def test_identity_sources_and_the_local_admin() -> None:
    alice = identity.resolve(OPTS, "alice")
    assert (alice.groups, alice.admin, alice.local) == (("teama",), False, False)
    assert alice.caller() == "salt-api (alice; groups teama)"
    assert identity.resolve(OPTS, "carol").admin
    assert identity.resolve(OPTS, "nobody").groups == ()
    root = identity.resolve(OPTS, "root", environ={})
    assert root.admin and root.local
    # sudo salt-run on the controller: Salt names the user sudo_<name>; only this process's sudo counts.
    assert identity.resolve(OPTS, "sudo_alice", environ={"SUDO_USER": "alice"}).local
    assert not identity.resolve(OPTS, "sudo_alice", environ={}).admin
    # Through eauth (salt-api) the runner runs in the salt-master process: an eauth user named root, or
    # sudo_<name> while the master itself was started with sudo, is no local admin.
    eauth = {**OPTS, "__cli": "salt-master"}
    spoof = identity.resolve(eauth, "root", environ={})
    assert (spoof.local, spoof.admin, spoof.groups) == (False, False, ())
    assert not identity.resolve(eauth, "sudo_alice", environ={"SUDO_USER": "alice"}).local
    assert identity.resolve({**OPTS, "__cli": "salt-run"}, "root", environ={}).local
    with pytest.raises(envelope.ApiError, match="auth.ldap.binddn and auth.ldap.bindpw"):
        identity.resolve({"mccloud_api": {"groups": "ldap"}}, "alice")
    with pytest.raises(envelope.ApiError, match="auth.ldap.binddn"):  # a per-user bind DN is no service account
        identity.resolve({"mccloud_api": {"groups": "ldap"}, "auth.ldap.binddn": "uid={{ username }},dc=x",
                          "auth.ldap.bindpw": "x"}, "alice")
    # LDAP groups with a service account, the directory unreachable (or python-ldap missing): refused, saying why.
    ldap_opts = {"mccloud_api": {"groups": "ldap"}, "auth.ldap.binddn": "cn=svc,dc=x", "auth.ldap.bindpw": "pw",
                 "auth.ldap.uri": "ldap://127.0.0.1:9", "auth.ldap.basedn": "dc=x"}
    with pytest.raises(envelope.ApiError) as refused:
        identity.resolve(ldap_opts, "alice")
    assert (refused.value.status, "directory" in refused.value.reason) == (403, True) or \
        (refused.value.status, "python-ldap" in refused.value.reason) == (501, True), refused.value.reason
    # Salt's message (the LDAP URI, the bind DN) goes to the log, not to the caller.
    assert not any(s in refused.value.reason for s in ("127.0.0.1", "cn=svc", "CommandExecution", "pw ")), \
        refused.value.reason
    # A broken master option is the controller's fault: 500, not the caller's 400.
    with pytest.raises(envelope.ServerError, match="mccloud_api:groups"):
        identity.resolve({"mccloud_api": {"groups": "kerberos"}}, "alice")
    with pytest.raises(envelope.ApiError, match="without an authenticated user"):
        identity.resolve(OPTS, None)
    assert identity.resolve({"mccloud_api": {"groups": "unix"}}, "root-not-a-user-here").groups == ()


def test_users_see_their_groups_vms_and_are_refused_others(tmp_path: Path, reg: mccloud.Registry) -> None:
    rows = call(tmp_path, reg, "alice", "vms")
    assert rows["ok"] and [v["name"] for v in rows["data"]] == ["a1.test", "a2.test"]
    a1 = rows["data"][0]
    assert a1["ssh"]["command"] == f"ssh -p {a1['ssh']['port']} root@{CN}" and a1["owners"] == ["teama"]
    assert "password" not in json.dumps(rows)
    # Another's VM: 403 naming the user, the VM and its owners; unknown: 404.
    refused = call(tmp_path, reg, "alice", "vm", name="b1.test")
    assert refused["status"] == 403 and "alice" in refused["reason"] and "b1.test" in refused["reason"] \
        and "teamb" in refused["reason"], refused
    assert call(tmp_path, reg, "alice", "vm", name="zz.test")["status"] == 404
    assert call(tmp_path, reg, "alice", "destroy", name="b1.test")["status"] == 403
    assert call(tmp_path, reg, "alice", "vms", owner="teamb")["status"] == 403
    assert [v["name"] for v in call(tmp_path, reg, "carol", "vms", owner="teamb")["data"]] == ["b1.test"]
    assert call(tmp_path, reg, "alice", "vms", node=OTHER)["status"] == 403
    assert call(tmp_path, reg, "alice", "vms", node="nowhere")["status"] == 404
    # A VM without owners of its own has its node's; a node without any, admins only.
    assert [v["name"] for v in call(tmp_path, reg, "olga", "vms")["data"]] == ["n1.test"]
    assert [v["name"] for v in call(tmp_path, reg, "carol", "vms")["data"]] == \
        ["a1.test", "a2.test", "b1.test", "n1.test", "x1.test"]
    assert call(tmp_path, reg, "alice", "vm", name="x1.test")["reason"].endswith("ask one of its owners or an admin")
    # Nodes: the node of one's VMs, with the count of one's VMs on it.
    nodes = call(tmp_path, reg, "alice", "nodes")["data"]
    assert [(n["name"], n["vms"], n["owners"]) for n in nodes] == [(CN, 2, ["ops"])]
    assert nodes[0]["capacity"]["ips"]["used"] == 4 and nodes[0]["capacity"]["ips"]["free"] > 0
    assert call(tmp_path, reg, "alice", "node", name=CN)["data"]["vm_names"] == ["a1.test", "a2.test"]
    assert call(tmp_path, reg, "alice", "node", name=OTHER)["status"] == 403
    # Refusals are journaled with the user and groups.
    entry = reg.audit(kind="api_refused", vm="b1.test")[0]
    assert entry["caller"] == "salt-api (alice; groups teama)" and "b1.test" in json.dumps(entry)
    who = call(tmp_path, reg, "alice", "whoami")["data"]
    assert who["user"] == "alice" and "link_node" not in who["verbs"] and "vms" in who["verbs"]
    assert "link_node" in call(tmp_path, reg, "carol", "whoami")["data"]["verbs"]
    assert call(tmp_path, reg, "alice", "link_node", name="n9", ip="192.0.2.9")["status"] == 403
    assert call(tmp_path, reg, "alice", "unlink_node", name=CN)["status"] == 403


def test_password_is_sealed_and_audited(tmp_path: Path, reg: mccloud.Registry) -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    spki = base64.b64encode(key.public_key().public_bytes(serialization.Encoding.DER,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    assert call(tmp_path, reg, "alice", "password", name="a1.test")["status"] == 400
    ret = call(tmp_path, reg, "alice", "password", name="a1.test", pubkey=spki)
    assert ret["ok"] and "password" not in ret["data"], ret
    clear = key.decrypt(base64.b64decode(ret["data"]["sealed"]),
                        padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(),
                                     label=None)).decode()
    assert clear == reg.find_password(CN, "a1.test")
    assert call(tmp_path, reg, "bob", "password", name="a1.test", pubkey=spki)["status"] == 403
    # Never in clear, not even for the local admin (runner returns reach the event bus).
    local = call(tmp_path, reg, "root", "password", name="a1.test")
    assert local["status"] == 400 and "mccloud inventory --vm a1.test -o json" in local["reason"], local
    assert clear not in json.dumps(local)
    entries = reg.audit(kind="password_read", vm="a1.test")
    assert [(e["caller"].split(" (")[0], e["after"]["root password"]) for e in entries] == \
        [("salt-api", "sealed")], entries
    assert clear not in json.dumps(reg.audit())
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    pem = small.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    with pytest.raises(envelope.BadRequest, match="1024-bit"):
        seal.seal("x", pem)
    with pytest.raises(envelope.BadRequest, match="not an RSA public key"):
        seal.seal("x", "bm90IGEga2V5")


def test_ssh_keys_are_checked() -> None:
    good = sshkey.parse(ED25519)
    assert good.type == "ssh-ed25519" and good.comment == "alice@laptop" and good.fingerprint.startswith("SHA256:")
    for bad, why in [
        ('command="rm -rf /" ' + ED25519, "must start with its type"),
        (ED25519 + "\nssh-ed25519 AAAA", "more than one line"),
        ("ssh-ed25519 !!!", "not valid base64"),
        ("ssh-rsa " + ED25519.split()[1], "its data is a 'ssh-ed25519'"),
        (ED25519.rsplit(" ", 1)[0] + " bad;comment", "comment"),
        ("", "empty"),
    ]:
        with pytest.raises(envelope.BadRequest, match=why):
            sshkey.parse(bad)
    assert sshkey.check_user("deploy") == "deploy"
    # The runner's entry point takes the verb's own user= (the caller is positional).
    ret = service.call("add_ssh_key", OPTS, "alice", None, None, name="a1.test", key="bad", user="deploy")
    assert (ret["status"], ret["retcode"]) == (400, 1) and "must start with its type" in ret["reason"], ret
    with pytest.raises(envelope.BadRequest):
        sshkey.check_user("root; rm")


def test_storage_names_the_backing(tmp_path: Path, reg: mccloud.Registry) -> None:
    listed = call(tmp_path, reg, "alice", "storage", name="a1.test")
    assert listed["data"]["backing"] == "dir" and listed["data"]["volumes"][0]["size"] == "10g", listed
    added = call(tmp_path, reg, "alice", "storage", name="a1.test", action="add", size="5g")
    assert added["status"] == 501 and "dir" in added["reason"] and "lvm" in added["reason"], added
    assert call(tmp_path, reg, "alice", "storage", name="a1.test", action="grow")["status"] == 400


def test_a_pillar_declared_vm_gets_its_dns_names_in_the_pillar(tmp_path: Path, reg: mccloud.Registry) -> None:
    ret = call(tmp_path, reg, "alice", "link_dns", name="a1.test", dns=["www.a1.test"])
    assert ret["status"] in (409, 501) and "pillar" in ret["reason"], ret
    assert call(tmp_path, reg, "alice", "link_dns", name="a1.test", dns=["not a name"])["status"] == 400


def fake_salt_run(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "fake_salt_run.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def wait_done(opts: dict[str, Any], job_id: str, secs: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        job = jobs.read(opts, job_id)
        assert job is not None
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running")


def test_jobs_run_detached_and_report_their_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = {"cachedir": str(tmp_path / "cache"), "config_dir": str(tmp_path)}
    ok_run = fake_salt_run(tmp_path, "import json, sys\n"
                           "print(json.dumps('[mc_cloud_vm] a1: spawn'))\n"
                           "print(json.dumps({'result': True, 'comment': 'done', 'password': 'hunter2'}, indent=1))\n")
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: ok_run)
    job_id = jobs.start(opts, "provision", "a1.test", CN, ["teama"], "alice", [["mc_cloud_vm.provision", "a1.test"]])
    job = wait_done(opts, job_id)
    assert job["state"] == "succeeded" and job["user"] == "alice" and job["owners"] == ["teama"], job
    texts = [m["text"] for m in job["messages"]]
    assert "[mc_cloud_vm] a1: spawn" in texts and texts[0] == "salt-run mc_cloud_vm.provision a1.test", texts
    assert job["result"]["runs"][0]["return"] == {"result": True, "comment": "done", "password": "<hidden>"}
    assert "hunter2" not in json.dumps(job)

    failing = fake_salt_run(tmp_path, "import json\nprint(json.dumps({'result': False, 'comment': 'no room'}))\n")
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: failing)
    job = wait_done(opts, jobs.start(opts, "destroy", "a1.test", CN, [], "bob", [["x"], ["never"]]))
    assert job["state"] == "failed" and len(job["result"]["runs"]) == 1, job
    assert job["messages"][-1]["text"] == "x: failed: no room"

    slow = fake_salt_run(tmp_path, "import time\ntime.sleep(30)\n")
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: slow)
    job_id = jobs.start(opts, "provision", "a2.test", CN, [], "alice", [["slow"]])
    assert jobs.read(opts, job_id)["state"] == "running"  # type: ignore[index]
    pid = int((jobs.root(opts) / job_id / "pid").read_text().split()[0])
    os.killpg(pid, 9)
    deadline = time.monotonic() + 10
    while jobs.read(opts, job_id)["state"] == "running" and time.monotonic() < deadline:  # type: ignore[index]
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it: this test started it
        except ChildProcessError:
            pass
        time.sleep(0.05)
    assert jobs.read(opts, job_id)["state"] == "lost"  # type: ignore[index]
    assert jobs.read(opts, "../etc") is None and jobs.ids(opts)[0] == job_id


def test_worker_reads_salt_run_output_as_it_comes() -> None:
    out = ['"[x] one"\n', '{"message": "two"}\n', "not json\n", "{\n", ' "result": true\n', "}\n"]
    assert list(worker.documents(iter(out))) == ["[x] one", {"message": "two"}, "not json", {"result": True}]


def test_the_worker_runs_as_a_module(tmp_path: Path) -> None:
    ret = subprocess.run([sys.executable, "-m", "mccloud.api.worker"], capture_output=True, text=True)
    assert ret.returncode == 2 and "usage" in ret.stderr


def test_a_new_vm_is_declared_on_a_node_of_the_callers_groups(tmp_path: Path, reg: mccloud.Registry,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The job runs a stand-in, never a salt-run of this machine's configuration.
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: fake_salt_run(tmp_path, "print('{}')\n"))
    refused = call(tmp_path, reg, "alice", "provision", name="new.test", node=CN)
    assert refused["status"] == 403 and "ops" in refused["reason"], refused
    assert call(tmp_path, reg, "alice", "provision", name="new.test")["status"] == 400  # which node?
    assert call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, owners=["teamb"])["status"] == 403
    assert call(tmp_path, reg, "alice", "provision", name="a1.test", image="other")["status"] == 409
    ret = call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, domains="new.test,www.new.test")
    assert ret["status"] == 202, ret
    decl = declarations.vm_declaration(reg, "new.test")
    assert decl is not None and (decl["node"], decl["vt"], decl["by"]) == (CN, "lxc", "olga"), decl
    assert decl["settings"]["owners"] == ["ops"] and decl["settings"]["domains"] == ["new.test", "www.new.test"]
    # A name the pillar files declare cannot be declared again through the API (on another node either).
    assert call(tmp_path, reg, "carol", "provision", name="x1.test", node=CN)["status"] == 409
    # Its job: the node's deploy, then the VM's provision.
    job = jobs.read(api_opts(tmp_path), ret["data"]["job"])
    assert job is not None and job["calls"] == [f"mc_cloud_compute_node.deploy {CN}", "mc_cloud_vm.provision new.test"]
    assert (job["user"], job["owners"]) == ("olga", ["ops"]), job


def test_dns_names_are_added_to_an_api_declaration(tmp_path: Path, reg: mccloud.Registry,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: fake_salt_run(tmp_path, "print('{}')\n"))
    assert call(tmp_path, reg, "olga", "provision", name="new.test", node=CN)["status"] == 202
    wait_done(api_opts(tmp_path), jobs.ids(api_opts(tmp_path))[0])
    ret = call(tmp_path, reg, "olga", "link_dns", name="new.test", dns="www.new.test")
    assert ret["status"] == 202 and ret["data"]["added"] == ["www.new.test"], ret
    assert "www.new.test" in ret["data"]["dns"]
    decl = declarations.vm_declaration(reg, "new.test")
    assert decl is not None and "www.new.test" in decl["settings"]["domains"], decl
    job = jobs.read(api_opts(tmp_path), ret["data"]["job"])
    assert job is not None and job["calls"][-1] == "mc_cloud_vm.provision new.test steps=reconfigure", job
    assert call(tmp_path, reg, "alice", "link_dns", name="new.test", dns="x.new.test")["status"] == 403


def test_nodes_are_linked_and_unlinked_by_admins(tmp_path: Path, reg: mccloud.Registry,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: fake_salt_run(tmp_path, "print('{}')\n"))
    assert call(tmp_path, reg, "carol", "link_node", name=CN, ip="192.0.2.1")["status"] == 409  # the files'
    assert call(tmp_path, reg, "carol", "link_node", name="n3.test", ip="not-an-ip")["status"] == 400
    ret = call(tmp_path, reg, "carol", "link_node", name="n3.test", ip="192.0.2.3", owners="teama")
    assert ret["status"] == 202, ret
    decl = declarations.node_declaration(reg, "n3.test")
    assert decl is not None and decl["settings"]["ip"] == "192.0.2.3" and decl["by"] == "carol", decl
    job = jobs.read(api_opts(tmp_path), ret["data"]["job"])
    assert job is not None and job["calls"] == ["mc_cloud_saltify.saltify n3.test",
                                                "mc_cloud_compute_node.deploy n3.test"], job
    assert call(tmp_path, reg, "carol", "unlink_node", name=CN)["status"] == 409  # the files'
    assert call(tmp_path, reg, "carol", "unlink_node", name="n9.test")["status"] == 404
    wait_done(api_opts(tmp_path), ret["data"]["job"])  # a node being linked is busy
    assert call(tmp_path, reg, "carol", "unlink_node", name="n3.test")["data"] == {"name": "n3.test",
                                                                                  "unlinked": True}
    assert declarations.node_declaration(reg, "n3.test") is None


def test_dns_names_are_normalised_and_cannot_be_claimed_from_others(tmp_path: Path, reg: mccloud.Registry,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: fake_salt_run(tmp_path, "print('{}')\n"))
    # Wildcards: 403 for a non-admin, journaled.
    for wild in ("*", "*.a.test", ["ok.new.test", "*.new.test"]):
        ret = call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, domains=wild)
        assert ret["status"] == 403 and "wildcard" in ret["reason"], ret
    assert declarations.vm_declaration(reg, "new.test") is None
    # Names another group's VM or a node uses: 409 naming it.
    for taken, what in (("b1.test", "VM b1.test"), ("B1.TEST", "VM b1.test"), (OTHER, f"compute node {OTHER}")):
        ret = call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, domains=[taken])
        assert ret["status"] == 409 and what in ret["reason"], ret
    assert reg.audit(kind="api_refused", vm="new.test")
    # Not a string or a list of strings: 400.
    for bad in (5, {"a": 1}, ["ok.test", 3]):
        assert call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, domains=bad)["status"] == 400
    # Stored lower-case.
    ret = call(tmp_path, reg, "olga", "provision", name="new.test", node=CN, domains="WWW.New.Test")
    assert ret["status"] == 202, ret
    decl = declarations.vm_declaration(reg, "new.test")
    assert decl is not None and decl["settings"]["domains"] == ["www.new.test"], decl
    wait_done(api_opts(tmp_path), ret["data"]["job"])
    # link_dns: the same checks; a name already linked in another case is not added twice.
    assert call(tmp_path, reg, "olga", "link_dns", name="new.test", dns="*")["status"] == 403
    assert call(tmp_path, reg, "olga", "link_dns", name="new.test", dns="a2.test")["status"] == 409
    assert call(tmp_path, reg, "olga", "link_dns", name="new.test", dns=7)["status"] == 400
    same = call(tmp_path, reg, "olga", "link_dns", name="new.test", dns="WWW.NEW.TEST")
    assert same["status"] == 200 and same["data"]["added"] == [], same
    # An admin may (it is its job to arbitrate).
    ret = call(tmp_path, reg, "carol", "link_dns", name="new.test", dns="*.new.test")
    assert ret["status"] == 202 and ret["data"]["added"] == ["*.new.test"], ret
    wait_done(api_opts(tmp_path), ret["data"]["job"])
    # The VM's names are now its own: another group cannot take them.
    assert call(tmp_path, reg, "alice", "link_dns", name="a1.test", dns="www.new.test")["status"] == 409


def test_a_vm_cannot_be_declared_again(tmp_path: Path, reg: mccloud.Registry,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: fake_salt_run(tmp_path, "print('{}')\n"))
    ret = call(tmp_path, reg, "olga", "provision", name="new.test", node=CN)
    assert ret["status"] == 202, ret
    wait_done(api_opts(tmp_path), ret["data"]["job"])
    # Another case of the same name is the same VM: no second declaration beside it.
    other = call(tmp_path, reg, "olga", "provision", name="NEW.TEST", node=CN)
    assert other["status"] == 202 and jobs.read(api_opts(tmp_path), other["data"]["job"])["target"] == "new.test"  # type: ignore[index]
    wait_done(api_opts(tmp_path), other["data"]["job"])
    assert [d["vm"] for d in reg.declarations()["vms"]] == ["new.test"]
    # The store declares it, though the inventory does not list it (the served pillar lags): 409, owners kept.
    fresh = service.Api(api_opts(tmp_path), "carol", pillar=pillar())
    with pytest.raises(envelope.Conflict, match="already declared through the API"):
        fresh.provision(name="New.Test", node=CN, owners=["cloud-admins"])
    decl = declarations.vm_declaration(reg, "new.test")
    assert decl is not None and decl["settings"]["owners"] == ["ops"], decl


def test_job_arguments_reach_salt_as_strings(tmp_path: Path) -> None:
    import salt.utils.args

    argv = jobs.salt_run_command({"config_dir": str(tmp_path)}, "mc_cloud_vm.provision",
                                 ["0x10", "null", "yes", "1e3", "steps=reconfigure", "skip=0x10"])
    args = argv[argv.index("mc_cloud_vm.provision") + 1:]
    assert args == ['"0x10"', '"null"', '"yes"', '"1e3"', 'steps="reconfigure"', 'skip="0x10"']
    parsed = salt.utils.args.parse_input(args, condition=False)
    assert parsed == (["0x10", "null", "yes", "1e3"], {"steps": "reconfigure", "skip": "0x10"}), parsed
    # Unquoted, Salt would have re-typed them (the defect this guards against).
    assert salt.utils.args.parse_input(["0x10", "null"], condition=False)[0] == [16, None]
    # A name cannot pass for a keyword argument.
    with pytest.raises(envelope.BadRequest, match="not a valid name"):
        service.Api.name_arg("steps=all", "name")


def test_the_worker_hides_the_cores_secret_keys() -> None:
    ret = worker.scrub({"sudo_password": "s", "ssh_gateway_password": "g", "nested": [{"password": "p"}]})
    assert ret == {"sudo_password": "<hidden>", "ssh_gateway_password": "<hidden>",
                   "nested": [{"password": "<hidden>"}]}


def test_a_zombie_worker_is_gone_but_its_salt_run_keeps_the_job_running(tmp_path: Path) -> None:
    # A zombie (exited, not reaped) is no live process.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while jobs.process_start(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Path(f"/proc/{child.pid}/stat").exists() and jobs.process_start(child.pid) is None
    child.wait()
    # A job whose worker died but whose process group (the salt-run) lives: running, then lost once it is gone.
    opts = {"cachedir": str(tmp_path / "cache")}
    group = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    jobdir = jobs.root(opts) / "20260101T000000000-abcdef"
    jobdir.mkdir(parents=True)
    jobs.write_json(jobdir / "job.json", {"id": jobdir.name, "kind": "provision", "target": "a1.test",
                                          "user": "alice", "started": jobs.now()})
    (jobdir / "pid").write_text(f"{group.pid} 1\n")  # the worker's start time: another process's
    assert jobs.read(opts, jobdir.name)["state"] == "running"  # type: ignore[index]
    group.kill()
    group.wait()
    assert jobs.read(opts, jobdir.name)["state"] == "lost"  # type: ignore[index]


def test_controller_failures_are_500_and_arguments_checked(tmp_path: Path, reg: mccloud.Registry,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A broken master option: 500, saying to ask the operator.
    ret = service.call("whoami", {"mccloud_api": {"groups": "map", "admin_groups": 5}}, "alice", None)
    assert (ret["status"], ret["error"]) == (500, "server_error") and "operator" in ret["reason"], ret
    # The store down: 500, not a 409 blaming the caller.
    def store_down(self: Any) -> Any:
        raise mccloud.StoreError("the store at /srv/x does not answer")

    monkeypatch.setattr(service.Api, "inventory", store_down)
    ret = service.call("vms", api_opts(tmp_path), "alice", None)
    assert (ret["status"], ret["retcode"]) == (500, 1) and "operator" in ret["reason"], ret

    # Anything unexpected: 500 without its traceback.
    def broken(self: Any) -> Any:
        raise KeyError("internal detail")

    monkeypatch.setattr(service.Api, "inventory", broken)
    ret = service.call("vms", api_opts(tmp_path), "alice", None)
    assert ret["status"] == 500 and "internal detail" not in ret["reason"] and "Traceback" not in ret["reason"]
    monkeypatch.undo()
    for bad in ("ten", True, 2.5, "-1", 0, 5000, None):
        assert call(tmp_path, reg, "alice", "jobs", limit=bad)["status"] == 400, bad
    assert call(tmp_path, reg, "alice", "jobs", limit="7")["ok"]


def test_nodes_are_not_declared_or_unlinked_while_busy(tmp_path: Path, reg: mccloud.Registry,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    slow = fake_salt_run(tmp_path, "import time\ntime.sleep(30)\n")
    monkeypatch.setattr(jobs, "salt_run_command", lambda o, fun, args: slow)
    first = call(tmp_path, reg, "carol", "link_node", name="n3.test", ip="192.0.2.3")
    assert first["status"] == 202, first
    try:
        again = call(tmp_path, reg, "carol", "link_node", name="n3.test", ip="192.0.2.4")
        assert again["status"] == 409 and "busy" in again["reason"], again
        decl = declarations.node_declaration(reg, "n3.test")
        assert decl is not None and decl["settings"]["ip"] == "192.0.2.3", decl  # not re-declared
        gone = call(tmp_path, reg, "carol", "unlink_node", name="n3.test")
        assert gone["status"] == 409 and "busy" in gone["reason"], gone
        assert declarations.node_declaration(reg, "n3.test") is not None
    finally:
        pid = int((jobs.root(api_opts(tmp_path)) / first["data"]["job"] / "pid").read_text().split()[0])
        os.killpg(pid, 9)


def test_a_destroy_elsewhere_keeps_the_vms_declaration(tmp_path: Path, reg: mccloud.Registry) -> None:
    from types import SimpleNamespace

    from mccloud.orchestration import teardown
    from mccloud.orchestration.runner import Outcome

    reg.declare_vm(CN, "new.test", "lxc", {"owners": ["ops"]}, "olga")
    env = SimpleNamespace(registry=reg, opts={}, name="mc_cloud_vm")
    out = Outcome()
    teardown.forget_declaration(env, out, "new.test", OTHER)  # type: ignore[arg-type]
    assert declarations.vm_declaration(reg, "new.test") is not None and out.steps == []
    teardown.forget_declaration(env, out, "new.test", CN)  # type: ignore[arg-type]
    assert declarations.vm_declaration(reg, "new.test") is None and out.steps[0]["name"] == "declaration"
