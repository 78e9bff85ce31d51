"""Salt loader, functional: the real loader finds the modules through the
``salt.loader`` entry point, and every public function turns mccloud errors
into Salt's exceptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import salt.config
import salt.loader
from salt.exceptions import CommandExecutionError, SaltInvocationError

from mccloud.cli import write_masterless_config

CN = "devhost10.local"
DOCUMENTED_FUNCTIONS = {
    "mc_cloud": ["settings", "inventory"],
    "mc_cloud_controller": ["settings", "gen_id"],
    "mc_cloud_compute_node": [
        "settings", "get_settings_for_target", "find_ip_for_vm", "find_mac_for_vm",
        "find_password_for_vm", "get_ssh_port", "get_snmp_port", "get_allocated_ips",
        "set_allocated_ip", "remove_allocated_ip", "cleanup_allocated_ips", "cleanup_ssh_ports",
        "cleanup_snmp_ports", "cleanup_idmaps", "destroy_vm_allocations", "get_reverse_proxies_for_target",
        "target_for_vm",
        "vt_for_vm", "get_vts",
    ],
    "mc_cloud_vm": ["vm_settings"],
    "mc_cloud_lxc": ["settings", "get_settings_for_vm"],
    "mc_cloud_kvm": ["settings", "get_settings_for_vm", "guests", "locate", "stop", "accel"],
    "mc_cloud_saltify": ["settings", "settings_for_target", "gen_id"],
    "mc_cloud_images": ["settings"],
}
BAD_MODE = {"makina-states.cloud.mode": "bogus"}
BAD_RANGE = {"makina-states.cloud.compute_node.ssh_port_range_start": 60000}
BAD_IMAGE = {"makina-states.cloud.images.lxc.default": "missing"}
BAD_KVM_IMAGE = {"makina-states.cloud.images.kvm.default": "missing"}
BAD_VMS = {"makina-states.cloud.lxc.vms": "not a mapping"}
# function -> (args, pillar additions, expected Salt exception): a bad
# command-line argument is a SaltInvocationError (Salt prints the usage);
# pillar, allocation and store problems are CommandExecutionError.
FAILURES: dict[str, tuple[tuple[Any, ...], dict[str, Any], type[Exception]]] = {
    "mc_cloud.settings": ((), BAD_MODE, CommandExecutionError),
    "mc_cloud.inventory": ((), BAD_VMS, CommandExecutionError),
    "mc_cloud_controller.settings": ((), BAD_MODE, CommandExecutionError),
    "mc_cloud_compute_node.settings": ((), BAD_RANGE, CommandExecutionError),
    "mc_cloud_compute_node.get_settings_for_target": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.find_ip_for_vm": ((CN, "ghost"), {}, CommandExecutionError),
    "mc_cloud_compute_node.find_mac_for_vm": ((CN, "lxc", "ghost"), {}, CommandExecutionError),
    "mc_cloud_compute_node.find_password_for_vm": ((CN, "ghost"), {}, CommandExecutionError),
    "mc_cloud_compute_node.get_ssh_port": (("vm1.foo", CN), BAD_RANGE, CommandExecutionError),
    "mc_cloud_compute_node.get_snmp_port": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.get_reverse_proxies_for_target": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.target_for_vm": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.vt_for_vm": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.get_vts": (("maybe",), {}, SaltInvocationError),
    "mc_cloud_compute_node.get_allocated_ips": (("a b",), {}, SaltInvocationError),
    "mc_cloud_compute_node.set_allocated_ip": ((CN, "vm1.foo", "10.5.0.1"), {}, SaltInvocationError),
    "mc_cloud_compute_node.remove_allocated_ip": ((CN, ".."), {}, SaltInvocationError),
    "mc_cloud_compute_node.cleanup_allocated_ips": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.cleanup_ssh_ports": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.cleanup_snmp_ports": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.cleanup_idmaps": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_compute_node.destroy_vm_allocations": ((CN, "vm1.foo"), {}, CommandExecutionError),
    "mc_cloud_lxc.settings": ((), BAD_MODE, CommandExecutionError),
    "mc_cloud_lxc.get_settings_for_vm": ((CN, "ghost"), {}, CommandExecutionError),
    "mc_cloud_kvm.settings": ((), BAD_KVM_IMAGE, CommandExecutionError),
    "mc_cloud_kvm.get_settings_for_vm": ((CN, "ghost"), {}, CommandExecutionError),
    "mc_cloud_kvm.guests": ((42,), {}, SaltInvocationError),
    "mc_cloud_kvm.locate": (("vm1.foo", 42), {}, SaltInvocationError),
    "mc_cloud_kvm.stop": (("vm1.foo", "/nonexistent", "soon"), {}, SaltInvocationError),
    "mc_cloud_saltify.settings": ((), BAD_MODE, CommandExecutionError),
    "mc_cloud_saltify.settings_for_target": (("ghost",), {}, CommandExecutionError),
    "mc_cloud_images.settings": ((), BAD_IMAGE, CommandExecutionError),
}
# Functions with no failure mode: pure string or pillar reads.
CANNOT_FAIL = {"mc_cloud_controller.gen_id", "mc_cloud_saltify.gen_id", "mc_cloud_vm.vm_settings",
               "mc_cloud_kvm.accel"}


def load(tmp_path: Path, extra: dict[str, Any] | None = None) -> Any:
    conf = write_masterless_config(str(tmp_path), "{}")
    opts = salt.config.minion_config(f"{conf}/minion")
    opts["pillar"] = {f"makina-states.cloud.lxc.vms.{CN}": {"vm1.foo": {}}, **(extra or {})}
    return salt.loader.minion_mods(opts)


def test_entry_point_loads_every_spec_function(tmp_path: Path) -> None:
    mods = load(tmp_path)
    missing = [f"{m}.{f}" for m, fs in DOCUMENTED_FUNCTIONS.items() for f in fs if f"{m}.{f}" not in mods]
    assert missing == []


def test_every_public_function_is_covered() -> None:
    listed = {f"{m}.{f}" for m, fs in DOCUMENTED_FUNCTIONS.items() for f in fs}
    assert listed == set(FAILURES) | CANNOT_FAIL


@pytest.mark.parametrize("fun", sorted(FAILURES))
def test_errors_become_salt_exceptions(tmp_path: Path, fun: str) -> None:
    args, pillar, expected = FAILURES[fun]
    mods = load(tmp_path, pillar)
    with pytest.raises(expected) as info:
        mods[fun](*args)
    assert str(info.value).strip(), "the message must say what is wrong"


def test_functions_work_through_the_loader(tmp_path: Path) -> None:
    mods = load(tmp_path)
    assert mods["mc_cloud_controller.gen_id"]("a.b") == "a-b"
    ip = mods["mc_cloud_compute_node.find_ip_for_vm"](CN, "vm1.foo")
    assert ip == "10.5.0.2"
    assert mods["mc_cloud_compute_node.get_allocated_ips"](CN) == {"api": 2, "ips": {"vm1.foo": ip}}
    assert mods["mc_cloud_vm.vm_settings"]()["markers"] == {
        "makina-states.cloud.is.vm": False,
        "makina-states.cloud.is.lxcvm": False,
    }
