"""Faults of a registry on PostgreSQL, as controllers meet them: one of them
killed (SIGKILL) in the middle of allocating, and the server restarted in
the middle of a run. Real ``salt-call`` processes (masterless controllers
of their own, allocating at once) on a real server the tests start; the
database is read with ``psql``. What must hold whatever the store does on
such a fault (give up at once, or try again on a new connection): every
call succeeds or says clearly that the database is unreachable (no
traceback, never the password); nothing acknowledged is lost or changed;
no value is handed out twice; nothing stays locked; calls succeed
afterwards."""

from __future__ import annotations

import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from tests.support.minion import Minion
from tests.support.postgres import HANG, Postgres, controller

pytestmark = pytest.mark.slow

CN = "cn1.example.net"
SECRET = "s3cret-never-shown"
#: What is unique to a VM (on its node; a MAC everywhere).
UNIQUE = ("ip", "mac", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port")
#: The VMs one controller registers at once, in one transaction, which the
#: kill and the restart interrupt while it writes them.
BULK = [f"bulk{i:03}.example.net" for i in range(300)]
#: How long the server stays down at most (seconds): about as long as a
#: store that tries again may keep trying, so that some calls may give up.
OUTAGE = 5.0


def own_vms(controllers: int, each: int) -> dict[str, list[str]]:
    """The VMs each controller registers one by one."""
    return {f"c{c}": [f"vm{c}{i}.example.net" for i in range(each)] for c in range(controllers)}


def controllers(pg: Postgres, db: str, base: Path, names: Iterable[str], vms: Iterable[str]) -> dict[str, Minion]:
    """Controllers named ``names`` sharing database ``db`` (a password in
    the connection string, each session named after its controller), each
    with the same pillar: ``vms`` on node CN."""
    info = pg.conninfo(db, password=SECRET)
    vms = list(vms)
    return {name: controller(base / name, f"{info} application_name={name}", CN, vms) for name in names}


def clear_failure(p: subprocess.CompletedProcess[str], db: str) -> None:
    """``p`` failed saying that the database ``db`` is unreachable."""
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "unreachable" in out and f":5432/{db}" in out, out
    assert "Traceback" not in out and SECRET not in out, out


def answer(p: subprocess.CompletedProcess[str]) -> Any:
    assert SECRET not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)["local"]


def register(m: Minion, vms: list[str]) -> dict[str, dict[str, Any]]:
    """Registers ``vms`` one call each: their settings."""
    return {vm: answer(m.call("mc_cloud_lxc.get_settings_for_vm", CN, vm)) for vm in vms}


def assert_unique(settings: dict[str, dict[str, Any]]) -> None:
    for key in UNIQUE:
        values = [s[key] for s in settings.values()]
        assert len(set(values)) == len(values), (key, sorted(values))


def assert_kept(acknowledged: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]],
                keys: Iterable[str] = (*UNIQUE, "password")) -> None:
    """Every value ``acknowledged`` (by VM) is what ``now`` holds."""
    changed = {(vm, k): (v, now.get(vm, {}).get(k)) for vm, s in acknowledged.items()
               for k, v in s.items() if k in keys and now.get(vm, {}).get(k) != v}
    assert changed == {}, changed


def test_a_controller_killed_while_allocating_leaves_nothing_half_done(server: Postgres, tmp_path: Path) -> None:
    """The victim registers the whole node (one transaction); it is killed,
    with its process group, in the middle of writing its rows: the test
    holds, uncommitted, the password row of the last VM, which the victim
    writes after its numbers, so the victim waits there until the test lets
    go, after the kill. Three controllers registering VMs of their own one
    call at a time meanwhile finish."""
    db = "killed"
    own = own_vms(3, 4)
    every_vm = [*BULK, *(vm for vms in own.values() for vm in vms)]
    ms = controllers(server, db, tmp_path, [*own, "victim"], every_vm)
    ms["c0"].call("mc_cloud_lxc.get_settings_for_vm", CN, own["c0"][0])  # the schema is made
    with ThreadPoolExecutor(max_workers=3) as pool:
        with server.holding(db, f"INSERT INTO passwords(cn, vm, password) VALUES ('{CN}', '{BULK[-1]}', 'held')"):
            victim = ms["victim"].start("mc_cloud_compute_node.get_settings_for_target", CN)
            running = [pool.submit(register, ms[name], vms) for name, vms in own.items()]
            pid, xid = server.writing(db, "victim", victim)
            victim.kill()
        acknowledged = {vm: s for done in running for vm, s in done.result().items()}
    assert victim.result().returncode < 0  # killed, not finished
    acknowledged[own["c0"][0]] = answer(ms["c0"].call("mc_cloud_lxc.get_settings_for_vm", CN, own["c0"][0]))

    # The killed session went away by itself, its transaction rolled back:
    # not one of its rows stays, and nothing stays locked.
    server.wait_gone(db, pid)
    assert server.psql(db, f"SELECT txid_status({xid})") == [["aborted"]]
    stored = server.allocations(db, CN)
    assert set(stored) == set(acknowledged), sorted(set(stored) ^ set(acknowledged))
    assert_kept(acknowledged, stored)
    assert_unique(stored)
    assert server.stuck(db) == []

    # The killed controller registers the node again: everything
    # acknowledged is what it gets, and nothing twice.
    again = answer(ms["victim"].call("mc_cloud_compute_node.get_settings_for_target", CN))["vms"]
    assert set(again) == set(every_vm)
    assert_kept(acknowledged, again, UNIQUE)
    assert_unique(again)
    one = {vm: answer(ms["victim"].call("mc_cloud_lxc.get_settings_for_vm", CN, vm)) for vm in (BULK[0], own["c1"][2])}
    stored = server.allocations(db, CN)
    assert_kept(again, stored, UNIQUE)
    assert_kept(acknowledged, stored)
    assert_kept(one, stored)
    assert server.stuck(db) == []


@dataclass
class Call:
    """A call of a controller during the restart test."""

    controller: str
    phase: str  # of the server when the call started
    result: subprocess.CompletedProcess[str]


class Run:
    """Calls of several controllers in threads, the server's phase (up,
    stopping, down, restarted) noted at the start of each."""

    def __init__(self) -> None:
        self.phase = "up"
        self.calls: list[Call] = []
        self.changed = threading.Condition()

    def set_phase(self, phase: str) -> None:
        with self.changed:
            self.phase = phase
            self.changed.notify_all()

    def call(self, name: str, m: Minion, *args: str) -> None:
        phase = self.phase
        p = m.call(*args)
        with self.changed:
            self.calls.append(Call(name, phase, p))
            self.changed.notify_all()

    def wait(self, done: Callable[[list[Call]], bool], timeout: float) -> bool:
        """Waits until ``done(calls)`` holds; whether it does."""
        with self.changed:
            return self.changed.wait_for(lambda: done(self.calls), timeout)

    def acknowledged(self) -> int:
        return sum(c.result.returncode == 0 for c in self.calls)

    def summary(self) -> str:
        return "\n".join(f"{c.controller} begun {c.phase}: {c.result.returncode} "
                         f"{(c.result.stdout + c.result.stderr)[-300:] if c.result.returncode else ''}"
                         for c in self.calls)


def test_a_server_restart_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Three controllers register VMs of their own one call at a time; once
    some are acknowledged, a fourth registers the whole node, and while its
    transaction writes (waiting for a row the test holds), the server is
    stopped (``pg_ctl stop -m fast``) and
    started again once a call began during the outage has ended (at most a
    few seconds)."""
    db = "restart"
    own = own_vms(3, 6)
    every_vm = [*BULK, *(vm for vms in own.values() for vm in vms)]
    with Postgres.running() as pg:  # a server of this test's own: it stops it
        ms = controllers(pg, db, tmp_path, [*own, "bulk"], every_vm)
        run = Run()

        def loop(name: str) -> None:
            for vm in own[name]:
                run.call(name, ms[name], "mc_cloud_lxc.get_settings_for_vm", CN, vm)

        with ThreadPoolExecutor(max_workers=3) as pool:
            loops = [pool.submit(loop, name) for name in own]
            run.wait(lambda calls: run.acknowledged() >= 3 or len(calls) == 18, HANG)
            assert run.acknowledged() >= 3, run.summary()
            # the bulk registration waits inside its write for the password
            # row of its last VM, held uncommitted, until the server stops
            with pg.holding(db, f"INSERT INTO passwords(cn, vm, password) VALUES ('{CN}', '{BULK[-1]}', 'held')"):
                bulk = ms["bulk"].start("mc_cloud_compute_node.get_settings_for_target", CN)
                pg.writing(db, "bulk", bulk)
                run.set_phase("stopping")
                pg.stop("fast")
            run.set_phase("down")
            run.wait(lambda calls: any(c.phase == "down" for c in calls), OUTAGE)
            pg.start()
            run.set_phase("restarted")
            for done in loops:
                done.result()
        run.calls.append(Call("bulk", "up", bulk.result()))
        print(run.summary())  # how the run went, shown on a failure

        # Each call succeeded or said the database is unreachable, never
        # showing the password; those begun after the restart succeeded.
        acknowledged: dict[str, dict[str, Any]] = {}
        acknowledged_bulk: dict[str, dict[str, Any]] = {}
        for c in run.calls:
            if c.result.returncode != 0 and c.phase != "restarted":
                clear_failure(c.result, db)
            elif c.controller == "bulk":
                acknowledged_bulk = answer(c.result)["vms"]
            else:
                acknowledged[answer(c.result)["name"]] = answer(c.result)

        # Afterwards every controller registers the node: all give the same
        # answers, those acknowledged before, each value once; the
        # database holds them; nothing stays locked.
        after = {name: answer(m.call("mc_cloud_compute_node.get_settings_for_target", CN))["vms"]
                 for name, m in ms.items()}
        first = after["c0"]
        assert set(first) == set(every_vm)
        for vms in after.values():
            assert_kept(first, vms, UNIQUE)
        assert_kept(acknowledged, first, UNIQUE)
        assert_kept(acknowledged_bulk, first, UNIQUE)
        assert_unique(first)
        stored = pg.allocations(db, CN)
        assert_kept(first, stored, UNIQUE)
        assert_kept(acknowledged, stored)
        assert_unique(stored)
        assert pg.stuck(db) == []
