"""Pillar values no YAML file can hold, from a ``#!py`` pillar (an
ext_pillar can hand over the same), through the real ``salt-call`` and
``salt-run``: a value nested thousands of levels deep, or one containing
itself, is a one-line error naming its pillar key, never a crash; and a
VM named after a node known only by its capacity is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mccloud import saltcompat
from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"
KEY = f"makina-states.cloud.lxc.vms.{CN}"
DEEP = """\
    value = inner = {}
    for _ in range(10000):
        inner["foo"] = {}
        inner = inner["foo"]
"""
LOOP = """\
    value = {}
    value["foo"] = value
"""


def py_pillar(salt_env: SaltEnv, body: str) -> None:
    """A second pillar file, ``#!py``, declaring ``value`` under the VM."""
    pillar = salt_env.base / "pillar"
    (pillar / "hostile.sls").write_text(
        f"#!py\ndef run():\n{body}    return {{{KEY!r}: {{{VM!r}: {{'foo': value}}}}}}\n")
    (pillar / "top.sls").write_text("base:\n  '*':\n    - cloud\n    - hostile\n")


def refused(output: str, returncode: int, *fragments: str) -> None:
    assert returncode != 0, output
    assert "Traceback" not in output and "RecursionError" not in output, output
    for fragment in fragments:
        assert fragment in output, (fragment, output)


@pytest.mark.parametrize(("body", "why"), [(DEEP, "nested more than 128 levels deep"), (LOOP, "contains itself")],
                         ids=["10,000 levels", "containing itself"])
def test_a_hostile_pillar_value_is_a_one_line_error_naming_its_key(salt_env: SaltEnv, body: str, why: str) -> None:
    py_pillar(salt_env, body)
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    if body == DEEP and saltcompat.release_line() < 3008:
        # Salt 3007's loader deep-copies its options, pillar included,
        # before any module loads: salt-call ends in Salt's own
        # RecursionError (an exit, not a crash), and mccloud never runs.
        assert r.returncode == 1 and "RecursionError" in r.output, r.output
        assert not re.search(r'File "[^"]*/mccloud/(?:[a-z_]+/)?[a-z_]+\.py"', r.output), r.output
        assert not salt_env.store_file.exists()
        return
    refused(r.output, r.returncode, f"pillar key {KEY}.{VM}.foo.foo", why)
    lines = [line for line in r.output.splitlines() if "pillar key" in line]
    assert len(lines) == 1 and lines[0].startswith("Error running 'mc_cloud_lxc.get_settings_for_vm': "), r.output
    assert not salt_env.store_file.exists(), "a refused call created the store"


def test_a_deep_pillar_value_is_named_by_the_runners_too(salt_env: SaltEnv) -> None:
    # The master's pillar cache cannot store it: Salt gives up first, the
    # pillar is compiled again without the cache and the core names the key.
    py_pillar(salt_env, DEEP)
    r = salt_env.run("mc_cloud.drift")
    refused(r.output, r.returncode, f"pillar key {KEY}.{VM}.foo.foo", "nested more than 128 levels deep")


def test_a_vm_named_after_a_node_known_by_its_capacity_is_refused(salt_env: SaltEnv, sample: dict) -> None:
    node = "spare1.example.net"
    pillar = {**sample, "makina-states.cloud.compute_node.capacity": {node: {"vms": 10}}}
    pillar[f"makina-states.services.cloud.lxc.targets.{CN}"][node] = {}
    salt_env.set_pillar(pillar)
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, node)
    refused(r.output, r.returncode, f"VM {node} on compute node {CN} has the minion id of compute node {node} "
            "(declared by its capacity): a VM would take over its Salt key; give the VM another name")
    assert not Path(salt_env.store_file).exists()
