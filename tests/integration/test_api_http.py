"""The API over HTTP, as its users meet it: salt-api (``rest_mccloud`` on
TLS, plain ``rest_cherrypy`` beside it) on the package's master, LDAP users
from a real slapd (alice of teama, bob of teamb, carol of cloud-admins),
and the runner ``mc_cloud_api`` behind.

For every verb: allowed on one's own VM, refused on another group's (403
and a reason naming the user and the owners), unknown (404); Salt's ACL
refusing a verb (401), a client other than the runner (400), an unknown
verb (500); a provision and a destroy followed to their end; the audit
journal naming the LDAP user; TLS verified against the generated
certificate; nothing listening beyond the configured ports on loopback.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.integration.conftest import API_VMS, NODE
from tests.support import ldapserver
from tests.support.api import HOST, ApiSetup, Response, User

A1, A2, B1 = sorted(API_VMS)
NOWHERE = "zz.nowhere.lan"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE5mGZbtbjW5l0u9y4Rj3CA9xqRZ1BcKNv0k1pBZWmnN alice@laptop"


@pytest.fixture(scope="module")
def api(api_cloud: Any, api_setup: ApiSetup) -> SimpleNamespace:
    c = api_setup.client()
    return SimpleNamespace(cloud=api_cloud, setup=api_setup, client=c, alice=c.as_user("alice"),
                           bob=c.as_user("bob"), carol=c.as_user("carol"))


def env(r: Response, status: int) -> dict[str, Any]:
    """The envelope of ``r``, checking the HTTP status is the envelope's."""
    e = r.envelope
    assert r.status == status and e["status"] == status, (r.status, r.text)
    assert e["ok"] is (status < 400), r.text
    return e


def refused(r: Response, *named: str) -> str:
    e = env(r, 403)
    assert e["error"] == "forbidden" and all(n in e["reason"] for n in named), e
    return str(e["reason"])


def names(r: Response) -> set[str]:
    return {row["name"] for row in env(r, 200)["data"]}


def follow(user: User, job: str, deadline: float = 240) -> dict[str, Any]:
    """Polls ``job`` until it ends; returns it."""
    end = time.monotonic() + deadline
    while True:
        data = env(user.call("job", id=job), 200)["data"]
        if data["state"] != "running":
            return dict(data)
        assert time.monotonic() < end, f"job {job} still running after {deadline:.0f} s: {data}"
        time.sleep(0.5)


class EventBus:
    """salt-api's ``GET /events`` read with ``user``'s token in a thread
    (the master's whole event bus: Salt's eauth has no permission for it)."""

    def __init__(self, setup: ApiSetup, user: User) -> None:
        ctx = ssl.create_default_context(cafile=str(setup.crt))
        self.conn = http.client.HTTPSConnection(HOST, setup.tls_port, context=ctx, timeout=30)
        self.conn.request("GET", "/events", headers={"X-Auth-Token": user.token, "Accept": "text/event-stream"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        self.text: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while line := self.response.readline():
                self.text.append(line.decode(errors="replace"))
        except (OSError, ValueError, AttributeError):  # closed under it
            pass

    def until(self, needle: str, secs: float = 20) -> str:
        end = time.monotonic() + secs
        while needle not in "".join(self.text) and time.monotonic() < end:
            time.sleep(0.1)
        self.conn.close()
        return "".join(self.text)


def keypair() -> tuple[Any, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, base64.b64encode(spki).decode()


def test_login_and_identity(api: SimpleNamespace) -> None:
    c = api.client
    assert c.post("/login", {"username": "alice", "password": "wrong", "eauth": "ldap"}).status == 401
    assert c.post("/login", {"username": "mallory", "password": ldapserver.PASSWORD, "eauth": "ldap"}).status == 401
    # No token, or a made-up one: 401 before Salt is asked anything.
    assert c.call("", "whoami").status == 401
    assert c.call("0123abcd", "whoami").status == 401
    me = env(api.alice.call("whoami"), 200)["data"]
    assert me["user"] == "alice" and "teama" in me["groups"] and me["admin"] is False, me
    assert "link_node" not in me["verbs"] and "provision" in me["verbs"], me
    carol = env(api.carol.call("whoami"), 200)["data"]
    assert carol["admin"] is True and "link_node" in carol["verbs"], carol


def test_each_group_sees_its_vms_only(api: SimpleNamespace) -> None:
    assert names(api.alice.call("vms")) == {A1, A2}
    assert names(api.bob.call("vms")) == {B1}
    assert names(api.carol.call("vms")) >= {A1, A2, B1}
    assert names(api.alice.call("vms", owner="teama")) == {A1, A2}
    assert names(api.alice.call("vms", node=NODE)) == {A1, A2}
    # Another group's VMs are a refusal, never an empty list.
    refused(api.alice.call("vms", owner="teamb"), "alice", "teamb")
    env(api.alice.call("vms", node="no-such-node"), 404)
    row = next(r for r in env(api.alice.call("vms"), 200)["data"] if r["name"] == A1)
    assert row["node"] == NODE and row["type"] == "nsbox" and row["owners"] == ["teama"], row
    nodes = env(api.alice.call("nodes"), 200)["data"]
    assert [n["name"] for n in nodes] == [NODE], nodes
    assert set(nodes[0]["capacity"]) == {"ips", "ssh_ports", "snmp_ports"} and nodes[0]["vms"] == 2, nodes
    node = env(api.alice.call("node", name=NODE), 200)["data"]
    assert node["name"] == NODE and sorted(node.get("vm_names", [])) == [A1, A2], node
    env(api.alice.call("node", name="no-such-node"), 404)


#: A real key for the password verb (always required, even for an admin): checked before or after the
#: ownership, a valid one leaves the 403 and the 404 to answer.
_, SPKI = keypair()
#: Each verb about one VM, with the arguments it needs besides the name.
VM_VERBS = [("vm", {}), ("password", {"pubkey": SPKI}), ("add_ssh_key", {"key": KEY}),
            ("link_dns", {"dns": ["www.b1.teamb.lan"]}), ("storage", {}), ("provision", {}), ("destroy", {})]


@pytest.mark.parametrize("verb,kwarg", VM_VERBS, ids=[v for v, _ in VM_VERBS])
def test_another_groups_vm_is_refused_an_unknown_one_not_found(api: SimpleNamespace, verb: str,
                                                               kwarg: dict[str, Any]) -> None:
    refused(api.alice.call(verb, name=B1, **kwarg), "alice", B1, "teamb")
    if verb == "provision":
        # A new VM: on a node that does not exist.
        env(api.alice.call(verb, name=NOWHERE, node="no-such-node"), 404)
    else:
        env(api.alice.call(verb, name=NOWHERE, **kwarg), 404)


def test_provision_password_and_destroy(api: SimpleNamespace) -> None:
    """alice provisions her VM, reads its password (sealed to her key),
    uses the other verbs on it and destroys it, following both jobs."""
    alice = api.alice
    started = env(alice.call("provision", name=A1), 202)
    job = follow(alice, started["data"]["job"])
    assert job["state"] == "succeeded" and job["user"] == "alice" and job["target"] == A1, job
    assert job["messages"], job

    vm = env(alice.call("vm", name=A1), 200)["data"]
    assert vm["state"] != "declared" and vm["ip"], vm
    assert re.fullmatch(rf"ssh -p {vm['ssh']['port']} root@\S+", vm["ssh"]["command"]), vm
    assert "password" not in vm, vm

    key, spki = keypair()
    bus = EventBus(api.setup, api.bob)  # another group's user, listening to the master's events
    sealed = env(alice.call("password", name=A1, pubkey=spki), 200)["data"]
    assert "password" not in sealed, sealed
    secret = key.decrypt(base64.b64decode(sealed["sealed"]),
                         padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None))
    assert len(secret) >= 8, secret
    # bob sees the answer go by on the bus (salt-api's /events): ciphertext only.
    seen = bus.until(sealed["sealed"])
    assert sealed["sealed"] in seen and secret.decode() not in seen, seen[-2000:]
    # Without a key of hers, the password does not travel (the event bus would carry it).
    assert "pubkey" in env(alice.call("password", name=A1), 400)["reason"]

    # nsbox guests are no minions: the key cannot be installed, and the API says why.
    assert "minion" in env(alice.call("add_ssh_key", name=A1, key=KEY), 409)["reason"]
    # A VM of the pillar files takes its names there.
    assert "pillar" in env(alice.call("link_dns", name=A1, dns=["www.a1.teama.lan"]), 409)["reason"]
    vols = env(alice.call("storage", name=A1), 200)["data"]
    assert vols["name"] == A1 and vols["volumes"][0]["name"] == "root", vols
    assert "nsbox" in env(alice.call("storage", name=A1, action="add", size="1G"), 501)["reason"]
    env(alice.call("storage", name=A1, action="grow"), 400)

    gone = follow(alice, env(alice.call("destroy", name=A1), 202)["data"]["job"])
    assert gone["state"] == "succeeded", gone
    assert env(alice.call("vm", name=A1), 200)["data"]["state"] == "declared"
    listed = {j["id"] for j in env(alice.call("jobs"), 200)["data"]}
    assert {started["data"]["job"], gone["id"]} <= listed

    entries = audit(api, "password_read")
    assert any(e["vm"] == A1 and "salt-api (alice; groups" in e["caller"] for e in entries), entries
    journal = json.dumps(api.cloud.run_cli.run("mc_cloud.audit").data)
    assert secret.decode() not in journal and sealed["sealed"] not in journal


def test_jobs_are_their_owners(api: SimpleNamespace) -> None:
    # bob's destroy of his never-provisioned VM: a job alice may not follow.
    job = env(api.bob.call("destroy", name=B1), 202)["data"]["job"]
    refused(api.alice.call("job", id=job), "alice", B1)
    assert job not in {j["id"] for j in env(api.alice.call("jobs"), 200)["data"]}
    follow(api.bob, job)
    env(api.alice.call("job", id="20260101T000000000-abcdef"), 404)
    assert names(api.carol.call("vms")) >= {B1}


def test_salt_refuses_before_mccloud(api: SimpleNamespace) -> None:
    c = api.client
    # The ACL (external_auth) grants cloud-users no link_node: Salt's 401.
    for verb, kw in (("link_node", {"name": "n2", "ip": "10.0.0.9"}), ("unlink_node", {"name": NODE})):
        r = api.alice.call(verb, **kw)
        assert r.status == 401 and "alice" in r.text and r.body is None, (verb, r.status, r.text)
    # Admins: their own checks answer.
    env(api.carol.call("link_node", name="n2", ip="not-an-ip"), 400)
    env(api.carol.call("unlink_node", name="no-such-node"), 404)
    assert "pillar" in env(api.carol.call("unlink_node", name=NODE), 409)["reason"]
    # A verb that does not exist: Salt's 500 (its message says nothing more).
    r = api.alice.call("no_such_verb")
    assert r.status == 500 and r.body == {"status": 500, "return": "An unexpected error occurred"}, r.text
    # Unexpected arguments: 400 naming them.
    assert "colour" in env(api.alice.call("vm", name=A2, colour="red"), 400)["reason"]
    # Only the runner client is enabled.
    for client in ("local", "wheel", "runner_async", "ssh"):
        r = c.post("/", [{"client": client, "tgt": "*", "fun": "test.ping"}], api.alice.token)
        assert r.status == 400 and "Client disabled" in r.text, (client, r.text[:200])
    # Several chunks at once: one status cannot speak for them all.
    r = c.post("/", [{"client": "runner", "fun": "mc_cloud_api.vm", "kwarg": {"name": B1}}] * 2, api.alice.token)
    assert r.status == 200 and [e["status"] for e in r.body["return"]] == [403, 403], r.text


def test_a_cross_site_form_is_refused(api: SimpleNamespace) -> None:
    """The session cookie /login sets, sent with a urlencoded body (what
    another site's <form> can post from alice's browser): 403 before any
    verb runs. The page's request (JSON and the token header) is served."""
    c = api.client
    r = c.post("/login", {"username": "alice", "password": ldapserver.PASSWORD, "eauth": "ldap"})
    cookie = next(v for k, v in r.headers.items() if k.lower() == "set-cookie").split(";", 1)[0]
    assert cookie.startswith("session_id="), cookie
    # As another site's fetch(url, {method: "POST", mode: "no-cors", credentials: "include", body:
    # new URLSearchParams(...)}) sends it (Accept */*: rest_cherrypy's page redirect lets it through).
    form = urllib.parse.urlencode({"client": "runner", "fun": "mc_cloud_api.whoami"}).encode()
    req = urllib.request.Request(api.setup.tls_url + "/", data=form, method="POST",
                                 headers={"Cookie": cookie, "Accept": "*/*",
                                          "Content-Type": "application/x-www-form-urlencoded;charset=UTF-8"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, context=c.context, timeout=30)
    text = refused.value.read().decode(errors="replace")
    assert refused.value.code == 403 and "X-Auth-Token" in text and "whoami" not in text, text[:500]
    token = cookie.split("=", 1)[1]
    assert env(c.call(token, "whoami"), 200)["data"]["user"] == "alice"


def test_plain_rest_cherrypy_answers_200(api: SimpleNamespace) -> None:
    alice = api.setup.client(plain=True).as_user("alice")
    r = alice.call("vm", name=B1)
    assert r.status == 200 and r.envelope["status"] == 403 and "teamb" in r.envelope["reason"], r.text
    assert r.status == 200 and alice.call("vm", name=A2).envelope["data"]["name"] == A2


def audit(api: SimpleNamespace, kind: str) -> list[dict[str, Any]]:
    ret = api.cloud.run_cli.run("mc_cloud.audit", f"kind={kind}")
    assert ret.returncode == 0 and isinstance(ret.data, list), ret.stdout + ret.stderr
    return list(ret.data)


def test_refusals_are_journaled_with_the_ldap_user(api: SimpleNamespace) -> None:
    refused(api.bob.call("vm", name=A2), "bob", A2)
    entries = audit(api, "api_refused")
    bob = [e for e in entries if e["vm"] == A2 and "salt-api (bob; groups" in e["caller"]]
    assert bob and "teamb" in bob[-1]["caller"], entries
    calls = audit(api, "api_call")
    assert any(e["vm"] == A1 and "salt-api (alice; groups" in e["caller"] for e in calls), calls


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            local = line.split()[3]
            host, _, port = local.rpartition(":")
            found.add((host.strip("[]"), int(port)))
    return found


def _tree(pid: int) -> set[int]:
    pids, children = {pid}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            pids.add(child)
            todo.append(child)
    return pids


def test_only_the_configured_ports_listen_on_loopback(api: SimpleNamespace, salt_api: Any, slapd: Any) -> None:
    setup = api.setup
    assert _listening(_tree(salt_api.pid)) == {(HOST, setup.tls_port), (HOST, setup.plain_port)}
    assert _listening(_tree(slapd._proc.pid)) == {(HOST, int(slapd.ldap_uri.rsplit(":", 1)[1].strip("/")))}


def test_tls(api: SimpleNamespace) -> None:
    setup = api.setup
    # Verified against the generated certificate (every call above was too).
    cert = ssl.get_server_certificate((HOST, setup.tls_port))
    assert cert.strip() == setup.crt.read_text().strip()
    # Unknown to the system's authorities; and no plain HTTP on the TLS port.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(setup.tls_url + "/", timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://{HOST}:{setup.tls_port}/", timeout=10).read()
    # The page, served by rest_mccloud at app_path.
    ctx = ssl.create_default_context(cafile=str(setup.crt))
    with urllib.request.urlopen(setup.tls_url + "/mccloud", context=ctx, timeout=10) as r:
        assert r.status == 200 and b"mc_cloud_api." in r.read()
