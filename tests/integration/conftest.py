"""A real Salt master and minion (pytest-salt-factories) on the test
bridge's gateway address, which the fixture creates before the master
starts: the node's minion and the VMs' minions reach the master there, and
nothing else does. The master never accepts a key by itself
(``auto_accept: False``; only the node's own minion is accepted by the
fixture): a VM becomes a minion through the key mccloud pre-seeds. A second
master stands for the mastersalt one (``mccloud_masters``), started by the
tests that need it. The end-to-end test starts a master and minion of its
own the same way (:func:`running_master`, :func:`running_minion`), with its
registry on PostgreSQL (``server``); the others keep the SQLite store.

The minion is both the controller's own minion and the compute node. Every
path, the bridge, the network, the port ranges and the firewall chain are
overridden in pillar so the tests never touch the defaults; what they do
change on the machine (a bridge, an iptables chain and NAT rule, sysctls) is
undone at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import subprocess
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from mccloud.orchestration import sls_root
from tests.support import ldapserver
from tests.support.api import ApiSetup
from tests.support.net import bridge_up
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres

NET = "10.199.7"
GATEWAY = f"{NET}.1"
#: The node's own minion: the only key the test master accepts by itself.
NODE = "mccloud-node"
SSH = (41000, 41009)
SNMP = (31000, 31009)
CHAIN = "MCCLOUD-TEST"
#: The nftables table of the tests that run the node on the nftables driver.
NFT_TABLE = "mccloud_test"
#: The controller's nightly image-sync cron stays off: no test touches root's crontab.
NO_IMAGE_SYNC = {"cron_sync": False, "cron_minute": "3", "cron_hour": "3"}
#: nsbox, the tests' own virtualisation type (its modules, runners and SLS).
NSBOX = Path(__file__).resolve().parent.parent / "drivers" / "nsbox"
#: The Salt wheelhouse the controller deploy builds (kept between runs: pip
#: builds it once per Salt version).
WHEELHOUSE = Path(os.environ.get("MCCLOUD_TEST_WHEELHOUSE", "/var/tmp/mccloud-test-wheelhouse"))
#: Phase timings of the end-to-end test, printed in pytest's summary.
TIMINGS: list[str] = []


@pytest.fixture(scope="session")
def e2e_timings() -> list[str]:
    return TIMINGS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "mccloud end-to-end phase timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def salt_factories_config() -> Iterator[dict[str, Any]]:
    # The daemons' launcher scripts name the code directory of the
    # interpreter that wrote them, and salt-factories reuses those in its
    # root directory (/tmp by default): a root of this run's own keeps
    # another interpreter's scripts (another virtualenv's mccloud) out.
    root = tempfile.mkdtemp(prefix="mcsf-")
    yield {"slow_stop": False, "root_dir": root}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def cloud_root() -> Iterator[Path]:
    # The root of an unprivileged container (a host uid of its own) must
    # traverse the directories down to its lxc path. Not under pytest's
    # base temporary directory: any pytest session starting meanwhile on the
    # machine makes /tmp/pytest-of-<user> 0700 again.
    root = Path(tempfile.mkdtemp(prefix="mccloud-cloud-"))
    root.chmod(0o711)
    for d in ("pillar", "store", "lxc", "etc"):
        (root / d).mkdir()
    (root / "lxc").chmod(0o711)
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def bridge() -> Iterator[str]:
    """The test bridge, up with the gateway address, before any master
    starts (the masters listen on that address)."""
    name = "mcbr" + uuid.uuid4().hex[:6]
    bridge_up(name, f"{GATEWAY}/24")
    yield name
    subprocess.run(["ip", "link", "del", name], capture_output=True)


@pytest.fixture(scope="package")
def test_states(cloud_root: Path) -> Path:
    """States of the tests' own, which the top file assigns to the VMs
    (their initial highstate applies them)."""
    root = cloud_root / "states"
    (root / "mccloud_test").mkdir(parents=True)
    (root / "top.sls").write_text("base:\n  'e2e*':\n    - mccloud_test.marker\n")
    (root / "mccloud_test" / "marker.sls").write_text(
        "mccloud-test-marker:\n"
        "  file.managed:\n"
        "    - name: /root/mccloud-highstate-marker\n"
        "    - contents: {{ grains['id'] | tojson }}\n"
        "mccloud-test-must-not-fail:\n"
        "  cmd.run:\n"
        "    - name: test ! -e /root/mccloud-fail-highstate\n"
    )
    (root / "mccloud_test" / "slow.sls").write_text(
        "mccloud-test-slow:\n"
        "  cmd.run:\n"
        "    - name: sleep 4\n"
    )
    return root


def cloud_pillar(root: Path, node: str, bridge: str, vms: dict[str, Any]) -> dict[str, Any]:
    return {
        # As deployments carry them: the registries' enable flags.
        **FLAGS,
        "makina-states.cloud.master": node,
        "makina-states.cloud.lxc.defaults.network": f"{NET}.0",
        "makina-states.cloud.lxc.defaults.netmask": "24",
        "makina-states.cloud.lxc.defaults.gateway": f"{NET}.1",
        "makina-states.cloud.lxc.defaults.bridge": bridge,
        "makina-states.cloud.lxc.defaults.lxc_path": str(root / "lxc"),
        "makina-states.cloud.lxc.vms." + node: vms,
        "makina-states.cloud.compute_node.ssh_port_range_start": SSH[0],
        "makina-states.cloud.compute_node.ssh_port_range_end": SSH[1],
        "makina-states.cloud.compute_node.snmp_port_range_start": SNMP[0],
        "makina-states.cloud.compute_node.snmp_port_range_end": SNMP[1],
        "makina-states.cloud.controller.ssh_key": str(root / "etc" / "ssh" / "id_mccloud"),
        "makina-states.cloud.images.lxc": {
            "default": "mccloud-test-img",
            "images": {"mccloud-test-img": {"template": "busybox"}},
            **NO_IMAGE_SYNC,
        },
        "makina-states.cloud.compute_node.conf." + node: {
            "bind_address": "127.0.0.1",
            "http_port": 18080,
            "https_port": 18443,
            "ssl_certs_dir": str(root / "etc" / "ssl" / "certs"),
            "haproxy_config": str(root / "etc" / "haproxy" / "haproxy.cfg"),
            "haproxy_service": False,
            "hosts_file": str(root / "etc" / "hosts"),
            "sysctl_file": str(root / "etc" / "sysctl-mccloud.conf"),
            "firewall_chain": CHAIN,
        },
    }


def write_pillar(root: Path, pillar: dict[str, Any]) -> None:
    (root / "pillar" / "top.sls").write_text("base:\n  '*':\n    - cloud\n")
    (root / "pillar" / "cloud.sls").write_text(yaml.safe_dump(pillar))


def _sysctl(name: str) -> str:
    return Path("/proc/sys/" + name.replace(".", "/")).read_text().strip()


@pytest.fixture(scope="package")
def host_state(bridge: str) -> Iterator[None]:
    """Restores what the states change on this machine."""
    saved = {k: _sysctl(k) for k in ("net.ipv4.ip_local_reserved_ports", "net.ipv4.ip_forward")}
    yield
    for k, v in saved.items():
        subprocess.run(["sysctl", "-q", "-w", f"{k}={v}"], check=False)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    subprocess.run(f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}; "
                   f"iptables -t nat -D PREROUTING -j {CHAIN}; "
                   f"iptables -t nat -D OUTPUT -m addrtype --dst-type LOCAL -j {CHAIN}; "
                   f"iptables -t nat -F {CHAIN}; iptables -t nat -X {CHAIN}",
                   shell=True, capture_output=True)
    subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True)
    for f in (f"/etc/mccloud/firewall-{NFT_TABLE}.nft", f"/var/lib/mccloud/firewall/{NFT_TABLE}.digest",
              f"/var/lib/mccloud/firewall/{NFT_TABLE}.listing"):
        if os.path.exists(f):
            os.remove(f)
    cidr = f"{NET}.0/24"
    subprocess.run(f"iptables -t nat -D POSTROUTING -s {cidr} ! -d {cidr} -j MASQUERADE",
                   shell=True, capture_output=True)
    for f in (f"/etc/network/interfaces.d/mccloud-{bridge}",):
        if os.path.exists(f):
            os.remove(f)


def accept_only(minion: str) -> Callable[[Any, dict[str, Any]], None]:
    """An auth handler for a salt-factories master that accepts ``minion``'s
    pending key and no other (the default handler accepts any)."""

    def handler(master: Any, payload: dict[str, Any]) -> None:
        if payload.get("act") == "pend" and payload.get("id") == minion:
            assert master.salt_key_cli().run("--yes", "--accept", minion).returncode == 0

    return handler


@pytest.fixture(scope="package")
def mastersalt_factory(salt_factories: Any, cloud_root: Path, bridge: str) -> Any:
    """The second master (mastersalt mode's), configured, not started."""
    return salt_factories.salt_master_daemon("mccloud-mastersalt", overrides={
        "interface": GATEWAY, "auto_accept": False, "open_mode": False,
        "file_roots": {"base": [str(cloud_root / "states")]},
    }, on_auth_event_callback=lambda master, payload: None)


@pytest.fixture(scope="package")
def mastersalt_master(mastersalt_factory: Any) -> Iterator[Any]:
    with mastersalt_factory.started(start_timeout=120):
        yield mastersalt_factory


@contextlib.contextmanager
def running_master(salt_factories: Any, name: str, node: str, cloud_root: Path, test_states: Path,
                   mastersalt_factory: Any, **more: Any) -> Iterator[Any]:
    """The controller's master ``name``, started, accepting only ``node``'s
    key; ``more`` overrides its configuration."""
    overrides = {
        "interface": GATEWAY,
        "auto_accept": False,
        "open_mode": False,
        "mccloud_masters": {"mastersalt": mastersalt_factory.config_file},
        "mccloud_wheelhouse": str(WHEELHOUSE),
        "file_roots": {"base": [sls_root(), str(NSBOX / "sls"), str(test_states)]},
        "runner_dirs": [str(NSBOX / "runners")],
        "mccloud_nsbox_root": str(cloud_root / "nsbox"),
        "pillar_roots": {"base": [str(cloud_root / "pillar")]},
        "mccloud_store_dir": str(cloud_root / "store"),
        "mccloud_sls_timeout": 600,
        # Job data reaches each minion through its own pillar (mccloud.orchestration.private).
        "ext_pillar": [{"mccloud": {}}],
        **more,
    }
    write_pillar(cloud_root, {})
    factory = salt_factories.salt_master_daemon(name, overrides=overrides, on_auth_event_callback=accept_only(node))
    with factory.started(start_timeout=120):
        yield factory


@contextlib.contextmanager
def running_minion(master: Any, node: str, cloud_root: Path, **more: Any) -> Iterator[Any]:
    """``node``, the controller's own minion and the compute node, started;
    ``more`` overrides its configuration."""
    overrides = {"mccloud_store_dir": str(cloud_root / "store"), "module_dirs": [str(NSBOX / "modules")],
                 "master": GATEWAY, "mccloud_registry_dir": str(cloud_root / "etc" / "makina-states"), **more}
    factory = master.salt_minion_daemon(node, overrides=overrides)
    with factory.started(start_timeout=120):
        yield factory


def seed_key(master: Any, minion: Any) -> None:
    """The second node's key, made and accepted before it starts (the
    package's master accepts only the first node's by itself)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = Path(minion.config["pki_dir"])
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "minion.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                                       serialization.NoEncryption()))
    (pki / "minion.pem").chmod(0o400)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (pki / "minion.pub").write_bytes(pub)
    accepted = Path(master.config["pki_dir"]) / "minions"
    accepted.mkdir(parents=True, exist_ok=True)
    (accepted / minion.id).write_bytes(pub)


@pytest.fixture(scope="session")
def slapd() -> Iterator[Any]:
    """The LDAP server of the API's users (:mod:`tests.support.ldapserver`),
    or None where slapd or python-ldap is missing (the API's tests then
    fail, saying what to install; the others run)."""
    if ldapserver.available():
        yield None
        return
    server = ldapserver.server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def api_setup(slapd: Any, tmp_path_factory: pytest.TempPathFactory) -> ApiSetup | None:
    """The API's ports, TLS certificate and master options
    (:mod:`tests.support.api`): in the master's configuration from the
    start, they cost the other tests nothing (salt-api starts only for the
    API's tests)."""
    if slapd is None:
        return None
    return ApiSetup(tmp_path_factory.mktemp("api"), ldap_uri=slapd.ldap_uri)


#: The API's test users (eauth ``file``, ``salt-run -a file``): name, password, groups.
API_USERS = {"alice": ("alice-pw", ["teama"]), "bob": ("bob-pw", ["teamb"]), "carol": ("carol-pw", ["cloud-admins"])}


def api_auth(cloud_root: Path) -> dict[str, Any]:
    """The master options of the API's tests: eauth ``file`` for
    :data:`API_USERS`, allowed the ``mc_cloud_api`` runner only, their
    groups by ``mccloud_api``'s map."""
    users = cloud_root / "etc" / "api-users"
    users.write_text("".join(f"{u}:{pw}\n" for u, (pw, _) in API_USERS.items()))
    users.chmod(0o600)
    return {
        "external_auth": {"file": {"^filename": str(users), "^filetype": "text",
                                   **{u: ["@mc_cloud_api"] for u in API_USERS}}},
        "mccloud_api": {"groups": "map", "map": {u: g for u, (_, g) in API_USERS.items()},
                        "admin_groups": ["cloud-admins"]},
    }


@pytest.fixture(scope="package")
def salt_master(salt_factories: Any, cloud_root: Path, host_state: None, bridge: str, test_states: Path,
                mastersalt_factory: Any, api_setup: ApiSetup | None) -> Iterator[Any]:
    auth = api_auth(cloud_root)
    if api_setup is not None:
        # LDAP gives the file users the same groups as api_auth's map.
        api = api_setup.master_overrides()
        auth = {**api, "external_auth": {**auth["external_auth"], **api["external_auth"]}}
    with running_master(salt_factories, "mccloud-master", NODE, cloud_root, test_states, mastersalt_factory,
                        **auth) as m:
        yield m


@pytest.fixture(scope="package")
def salt_api(salt_master: Any, api_setup: ApiSetup | None) -> Iterator[Any]:
    """salt-api on the package's master: rest_mccloud (TLS) and
    rest_cherrypy (plain HTTP), both on 127.0.0.1."""
    if api_setup is None:
        pytest.fail(f"the API's tests need an LDAP server: {ldapserver.available()}")
    factory = salt_master.salt_api_daemon()
    factory.check_ports = [api_setup.tls_port, api_setup.plain_port]
    with factory.started(start_timeout=60):
        yield factory


@pytest.fixture(scope="package")
def salt_minion(salt_master: Any, cloud_root: Path) -> Iterator[Any]:
    with running_minion(salt_master, NODE, cloud_root) as m:
        yield m


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    """A PostgreSQL server of the module's own (``tests.support.postgres``),
    for the tests whose registry is on PostgreSQL."""
    with Postgres.running() as pg:
        yield pg


@pytest.fixture(scope="package")
def cloud(salt_master: Any, salt_minion: Any, cloud_root: Path, bridge: str) -> "Cloud":
    return Cloud(salt_master, salt_minion, cloud_root, bridge)


def last_json(text: str) -> Any:
    """The runner's return: the last JSON document of ``salt-run --out=json``
    output (progress events come before it)."""
    decoder, pos, last = json.JSONDecoder(), 0, None
    while True:
        start = text.find("{", pos)
        if start < 0:
            return last
        try:
            last, pos = decoder.raw_decode(text, start)
        except ValueError:
            pos = start + 1


class Cloud:
    """The running master and minion, and helpers to drive them."""

    def __init__(self, master: Any, minion: Any, root: Path, bridge: str) -> None:
        self.master, self.minion, self.root, self.bridge = master, minion, root, bridge
        self.node = minion.id
        self.run_cli = master.salt_run_cli(timeout=900)
        self.call_cli = minion.salt_call_cli(timeout=300)

    def set_vms(self, vms: dict[str, Any], **extra: Any) -> None:
        write_pillar(self.root, {**cloud_pillar(self.root, self.node, self.bridge, vms), **extra})
        ret = self.call_cli.run("saltutil.refresh_pillar", wait=True)
        assert ret.returncode == 0, ret.stderr

    def run(self, fun: str, *args: str) -> Any:
        """``salt-run fun args`` returning (exit code, data)."""
        ret = self.run_cli.run(fun, *args)
        return ret.returncode, last_json(ret.stdout), ret.stdout + ret.stderr

    def grain(self, name: str) -> Any:
        return self.call_cli.run("grains.get", name).data


#: The API's tests: nsbox guests declared in the pillar with their owners
#: (``a*`` of teama, ``b1`` of teamb) on the node, which teama and teamb
#: both own (they may create VMs there).
API_VMS = {"a1.teama.lan": ["teama"], "a2.teama.lan": ["teama"], "b1.teamb.lan": ["teamb"]}


def api_pillar(cloud: Cloud) -> dict[str, Any]:
    etc = cloud.root / "etc"
    return {
        "makina-states.cloud.compute_node.conf." + cloud.node: {
            "bind_address": "127.0.0.1", "http_port": 18084, "https_port": 18447,
            "ssl_certs_dir": str(etc / "ssl" / "api-certs"), "haproxy_config": str(etc / "haproxy" / "api.cfg"),
            "haproxy_service": False, "haproxy_pidfile": str(etc / "haproxy-api.pid"),
            "hosts_file": str(etc / "hosts"), "sysctl_file": str(etc / "sysctl-mccloud.conf"),
            "firewall_chain": CHAIN, "owners": ["teama", "teamb"],
        },
        f"makina-states.cloud.nsbox.vms.{cloud.node}": {vm: {"owners": o} for vm, o in API_VMS.items()},
        "makina-states.cloud.nsbox.defaults.network": f"{NET}.0",
        "makina-states.cloud.nsbox.defaults.netmask": "24",
        "makina-states.cloud.nsbox.defaults.gateway": f"{NET}.1",
        "makina-states.cloud.nsbox.defaults.bridge": cloud.bridge,
    }


@pytest.fixture(scope="module")
def api_cloud(cloud: Cloud, salt_api: Any) -> Iterator[Cloud]:
    """The cloud of the API's tests (:func:`api_pillar`) with salt-api up;
    afterwards, every VM the module provisioned (or declared through the
    API) is destroyed and the node's proxy stopped."""
    cloud.set_vms({}, **api_pillar(cloud))
    # The controller's ssh key pair, which a provision installs in the guests.
    rc, data, out = cloud.run("mc_cloud_controller.deploy")
    assert rc == 0 and data and data["result"] is True, out
    yield cloud
    rc, inv, _ = cloud.run("mc_cloud_api.vms")
    for row in (inv or {}).get("data") or []:
        if row["state"] != "declared":
            cloud.run("mc_cloud_vm.destroy", row["name"])
    pid = cloud.root / "etc" / "haproxy-api.pid"
    if pid.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid.read_text().split()[0]), 15)
