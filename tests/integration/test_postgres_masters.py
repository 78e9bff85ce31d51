"""Three controllers on one registry, through the real ``salt-run``: three
salt masters (pytest-salt-factories, each with its own configuration, root
and pillar) whose ``mccloud_store`` names one database of a PostgreSQL
server the module starts. Every master's pillar declares the same compute
node and VMs, as deployments carry it (the enable flags, flat dotted keys).
Their runners allocate at the same time: no IP, MAC or port is handed out
twice, no allocation is lost (every master then answers the same for every
VM, and the database holds exactly that), and the password of the
connection string shows in no output."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.conftest import last_json, write_pillar
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres

pytestmark = pytest.mark.slow

CN = "cn1.example.net"
MASTERS = ("a", "b", "c")
#: Each master first allocates VMs of its own, one ``salt-run`` each...
OWN = {m: [f"vm-{m}{i}.example.net" for i in range(3)] for m in MASTERS}
#: ... then all three register the node at once: these VMs, which nobody
#: allocated yet, are allocated by whichever master comes first.
RACED = [f"vm-race{i}.example.net" for i in range(6)]
ALL = [*(vm for m in MASTERS for vm in OWN[m]), *RACED]
#: What the registry holds for a VM, as the settings show it.
NUMBERS = ("ip", "mac", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port")
DB, SECRET = "controllers", f"pg-s3cret-{uuid.uuid4().hex}"


class Master:
    """A running master of the module and what the test ran on it."""

    def __init__(self, name: str, factory: Any, root: Path) -> None:
        self.name, self.factory, self.root = name, factory, root
        self.cli = factory.salt_run_cli(timeout=300)
        #: Every ``salt-run`` output (stdout and stderr), for the password check.
        self.outputs: list[str] = []

    def run(self, fun: str, *args: str, **kwargs: Any) -> tuple[int, Any, str]:
        """``salt-run fun args``: exit code, the runner's return, output."""
        ret = self.cli.run(fun, *args, **kwargs)
        out = ret.stdout + ret.stderr
        self.outputs.append(out)
        return ret.returncode, last_json(ret.stdout), out

    def vm(self, vm: str) -> dict[str, Any]:
        """What ``vm`` is handed (allocated on first call), as provisioning
        pushes it into the VM."""
        rc, data, out = self.run("mc_cloud_vm.vm_sls_pillar", CN, vm)
        assert rc == 0 and isinstance(data, dict) and data.get("mccloud_vmname") == vm, out
        return dict(data["vtVmData"])

    def node(self) -> dict[str, dict[str, Any]]:
        """Per VM of the node, its settings: the registry a deploy pushes
        to the node (registers it, allocating every VM not allocated yet)."""
        rc, data, out = self.run("mc_cloud_compute_node.cn_sls_pillar", CN)
        assert rc == 0 and isinstance(data, dict) and "cnSettings" in data, out
        return dict(data["cnSettings"]["cn"]["vms"])


@pytest.fixture(scope="module")
def masters(salt_factories: Any, server: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Master]]:
    """The three masters, started, on one database."""
    info = server.conninfo(DB, password=SECRET)
    pillar = {**FLAGS, f"makina-states.cloud.lxc.vms.{CN}": {vm: {} for vm in ALL}}
    with contextlib.ExitStack() as stack:
        out = []
        for name in MASTERS:
            root = tmp_path_factory.mktemp(f"controller-{name}")
            (root / "pillar").mkdir()
            write_pillar(root, pillar)
            factory = salt_factories.salt_master_daemon(f"mccloud-pg-{name}", overrides={
                "interface": "127.0.0.1", "auto_accept": False, "open_mode": False, "worker_threads": 2,
                "pillar_roots": {"base": [str(root / "pillar")]}, "mccloud_store": info,
            })
            stack.enter_context(factory.started(start_timeout=120))
            out.append(Master(name, factory, root))
        yield out


def at_once(masters: list[Master], work: Any) -> list[Any]:
    """``work(master)`` on the three masters at the same time."""
    with ThreadPoolExecutor(max_workers=len(masters)) as pool:
        return list(pool.map(work, masters))


def numbers(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: settings[k] for k in NUMBERS}


def sha512_crypt(password: str, like: str) -> str:
    """``password`` hashed with the salt of the SHA-512 crypt hash ``like``
    (``$6$salt$...``), by ``openssl passwd``."""
    salt = like.split("$")[2]
    p = subprocess.run(["openssl", "passwd", "-6", "-salt", salt, "-stdin"], input=password, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_three_masters_share_one_registry_and_never_hand_out_a_value_twice(masters: list[Master],
                                                                          server: Postgres) -> None:
    own = at_once(masters, lambda m: {vm: numbers(m.vm(vm)) for vm in OWN[m.name]})
    first = {vm: values for answers in own for vm, values in answers.items()}
    raced = at_once(masters, Master.node)
    # The three registrations at once agree on every VM, the raced ones too.
    assert [sorted(nodes) for nodes in raced] == [sorted(ALL)] * 3
    assert raced[1] == raced[0] and raced[2] == raced[0], (raced[0], raced[1], raced[2])
    handed = {vm: numbers(s) for vm, s in raced[0].items()}
    for key in NUMBERS:
        values = [v[key] for v in handed.values()]
        assert len(set(values)) == len(ALL), (key, values)
    # No allocation lost: what each master handed out first stays, and every
    # master answers every VM alike afterwards, whoever allocated it.
    assert {vm: handed[vm] for vm in first} == first
    afterwards = at_once(masters, Master.node)
    assert all(nodes == raced[0] for nodes in afterwards)
    sample = [OWN["a"][0], OWN["c"][2], RACED[5]]
    pushed = at_once(masters, lambda m: {vm: m.vm(vm) for vm in sample})
    for vm in sample:
        assert [numbers(p[vm]) for p in pushed] == [handed[vm]] * 3, vm
        assert len({p[vm]["password"] for p in pushed}) == 1, vm
    # The database holds exactly that, and the password behind each hash;
    # no SQLite store anywhere.
    rows = server.allocations(DB, CN)
    assert {vm: numbers(r) for vm, r in rows.items()} == handed
    for vm in sample:
        assert sha512_crypt(rows[vm]["password"], pushed[0][vm]["password"]) == pushed[0][vm]["password"], vm
    assert [p for m in masters for p in m.root.rglob("registry.sqlite*")] == []
    check_secret_kept(masters)


def test_an_unreachable_database_is_said_so_without_its_password(masters: list[Master], tmp_path: Path) -> None:
    """``MCCLOUD_STORE`` (which wins over the configuration) naming a
    server that is not there: the runner fails saying so, naming the
    database without the password."""
    nowhere = f"host={tmp_path} user=mccloud dbname=nowhere"
    master = masters[0]
    rc, data, out = master.run("mc_cloud_vm.vm_sls_pillar", CN, OWN["a"][0],
                               env={"MCCLOUD_STORE": f"{nowhere} password={SECRET}"})
    # the database as parsed (user, socket directory, port, database), never the text
    assert rc != 0 and "unreachable" in out and "postgresql://mccloud@" in out, out
    assert f"socket directory {tmp_path} port 5432" in out and ":5432/nowhere" in out, out
    assert SECRET not in out, out
    assert not (isinstance(data, dict) and "vtVmData" in data), out
    check_secret_kept(masters)


def check_secret_kept(masters: list[Master]) -> None:
    """The password is in no ``salt-run`` output, nor in what the masters
    keep (job cache, logs)."""
    assert [out for m in masters for out in m.outputs if SECRET in out] == []
    for m in masters:
        kept = [Path(m.factory.config["log_file"]), *Path(m.factory.config["cachedir"]).rglob("*")]
        assert [f for f in kept if f.is_file() and SECRET.encode() in f.read_bytes()] == []
