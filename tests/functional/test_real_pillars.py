"""The pillars real deployments carry (``tests/support/pillars.py``): every
public execution-module function through the real Salt loader, and the
node deploy and VM provision runners' data paths, work on each; and a
registry's enable flag, added to any of them in any form and with any value
that is not a mapping, changes no result (a property test)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import salt.config
import salt.loader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mccloud import localreg
from mccloud.cli import write_masterless_config
from mccloud.drivers import lxc
from mccloud.orchestration import compute_node_deploy, minions, transport, vm_provision
from mccloud.orchestration.deploy import controller_data
from tests.support.pillars import CLOUD, FLAG_NAMES, RealPillar, corpus
from tests.support.runners import Jobs, Minions, Offline

CORPUS = {rp.name: rp for rp in corpus()}
CONTROLLER = "controller.example.net"
REGISTRY = "1 mc_cloud.registry()"
#: Values a registry's prefix may hold that are not its settings.
NOT_MAPPINGS = st.one_of(st.booleans(), st.none(), st.sampled_from(["yes", "true", 1, 0, [True]]))


def load(base: Path, rp: RealPillar, pillar: Mapping[str, Any]) -> Any:
    """The execution modules of a masterless controller over ``pillar``."""
    conf = write_masterless_config(str(base), "{}", minion_id=CONTROLLER)
    opts = salt.config.minion_config(f"{conf}/minion")
    opts.update(rp.opts)
    opts.update({"pillar": dict(pillar), "mccloud_store_dir": str(base / "store"),
                 localreg.DIR_OPT: str(base / "registries")})
    return salt.loader.minion_mods(opts)


def calls(rp: RealPillar) -> list[tuple[str, tuple[Any, ...]]]:
    """Every public function of every module, with arguments from the
    pillar's node, VMs and saltify target; allocating calls before the
    reads of what they allocated, destroying ones last."""
    cn, first, last = rp.cn, rp.vms[0], rp.vms[-1]
    out: list[tuple[str, tuple[Any, ...]]] = [
        ("mc_cloud.settings", ()), ("mc_cloud.registry", ()), ("mc_cloud.is_vm", ()),
        ("mc_cloud_controller.settings", ()), ("mc_cloud_controller.gen_id", (cn,)),
        ("mc_cloud_images.settings", ()), ("mc_cloud_lxc.settings", ()), ("mc_cloud_saltify.settings", ()),
        ("mc_cloud_saltify.gen_id", (cn,)), ("mc_cloud_compute_node.settings", ()),
        ("mc_cloud_compute_node.get_vts", ()), ("mc_cloud_compute_node.is_compute_node", ()),
        ("mc_cloud_vm.vm_settings", ()), ("mc_cloud_vm.settings", ()),
    ]
    for vm in rp.vms:
        out += [
            ("mc_cloud_lxc.get_settings_for_vm", (cn, vm)),
            ("mc_cloud_compute_node.find_ip_for_vm", (cn, vm)),
            ("mc_cloud_compute_node.find_mac_for_vm", (cn, "lxc", vm)),
            ("mc_cloud_compute_node.find_password_for_vm", (cn, "lxc", vm)),
            ("mc_cloud_compute_node.get_ssh_port", (vm,)),
            ("mc_cloud_compute_node.get_snmp_port", (vm, cn)),
            ("mc_cloud_compute_node.target_for_vm", (vm,)),
            ("mc_cloud_compute_node.vt_for_vm", (vm,)),
        ]
    out += [
        ("mc_cloud_compute_node.get_settings_for_target", (cn,)),
        ("mc_cloud_compute_node.get_reverse_proxies_for_target", (cn,)),
        ("mc_cloud_compute_node.get_allocated_ips", (cn,)),
        ("mc_cloud_compute_node.cleanup_allocated_ips", (cn,)),
        ("mc_cloud_compute_node.cleanup_ssh_ports", (cn,)),
        ("mc_cloud_compute_node.cleanup_snmp_ports", (cn,)),
        ("mc_cloud_compute_node.cleanup_idmaps", (cn,)),
        ("mc_cloud.inventory", ()),
        ("mc_cloud_controller.ensure_ca_present", ()),
        ("mc_cloud_controller.get_cacert", ()),
        ("mc_cloud_controller.get_certs_dir", ()),
        ("mc_cloud_controller.get_cert_for", (first, True)),
        ("mc_cloud_controller.search_matching_certificate", (first,)),
        ("mc_cloud_controller.ssl_certs", ([first],)),
        ("mc_cloud_controller.domain_match", (first, f"*.{first.split('.', 1)[1]}")),
        ("mc_cloud_compute_node.set_allocated_ip", (cn, last, IpOf(cn, last))),
        ("mc_cloud_compute_node.remove_allocated_ip", (cn, IpOf(cn, last))),
        ("mc_cloud_compute_node.destroy_vm_allocations", (cn, last)),
    ]
    if rp.target:
        out.append(("mc_cloud_saltify.settings_for_target", (rp.target,)))
    return out


@dataclass(frozen=True)
class IpOf:
    """An argument: the IP the VM holds when the call is made."""

    cn: str
    vm: str


def run_all(mods: Any, rp: RealPillar) -> dict[str, Any]:
    """Each call's result, or its exception as ``!<type>: <message>``."""
    out: dict[str, Any] = {}
    for i, (fun, args) in enumerate(calls(rp)):
        try:
            args = tuple(mods["mc_cloud_compute_node.find_ip_for_vm"](a.cn, a.vm) if isinstance(a, IpOf) else a
                         for a in args)
            out[f"{i} {fun}{args}"] = mods[fun](*args)
        except Exception as exc:  # noqa: BLE001 - the comparison records any failure
            out[f"{i} {fun}{args}"] = f"!{type(exc).__name__}: {exc}"
    return out


def scrub(value: Any, roots: tuple[str, ...]) -> Any:
    """``value`` without what differs between two stores by design:
    generated passwords, keys and certificates (each store has its own
    CA), the test's directories, and timings."""
    if isinstance(value, Mapping):
        return {k: scrub(v, roots) for k, v in value.items()
                if "password" not in str(k) and k not in ("duration", "slowest", "seconds", "job_seconds")}
    if isinstance(value, (list, tuple)):
        return [scrub(v, roots) for v in value]
    if isinstance(value, str):
        if "-----BEGIN" in value:
            return "<pem>"
        for root in roots:
            value = value.replace(root, "<tmp>")
    return value


def flagged(rp: RealPillar, flags: Mapping[str, Any], nested: bool) -> dict[str, Any]:
    """The pillar with ``flags`` added (where its registry has no mapping
    under the same key: a pillar key holds one value)."""
    pillar = rp.without_flags()
    if nested and CLOUD not in pillar:
        pillar[CLOUD] = dict(flags)
    else:
        pillar.update({f"{CLOUD}.{k}": v for k, v in flags.items() if f"{CLOUD}.{k}" not in pillar})
    return pillar


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_function_works_on_the_pillars_deployments_carry(tmp_path: Path, name: str) -> None:
    rp = CORPUS[name]
    got = run_all(load(tmp_path, rp, rp.pillar), rp)
    failed = {k: v for k, v in got.items() if isinstance(v, str) and v.startswith("!")}
    assert failed == {}
    cloud = got["0 mc_cloud.settings()"]
    assert not {"generic", "lxc", "saltify"} & set(cloud), "the enable flags are not settings"
    registry = got["1 mc_cloud.registry()"]
    assert registry["is"]["lxc"] is True and registry["actives"].keys() >= {"lxc", "saltify"}
    settings_key = next(k for k in got if k.split(" ", 1)[1].startswith("mc_cloud_lxc.get_settings_for_vm"))
    s = got[settings_key]
    assert s["name"] == rp.vms[0] and s["ip"].startswith("10.5.") and s["ssh_gateway"] == rp.cn


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(CORPUS)),
       flags=st.dictionaries(st.sampled_from(FLAG_NAMES), NOT_MAPPINGS, min_size=1),
       nested=st.booleans())
def test_enable_flags_change_no_result(tmp_path_factory: pytest.TempPathFactory, name: str,
                                       flags: dict[str, Any], nested: bool) -> None:
    rp = CORPUS[name]
    a, b = tmp_path_factory.mktemp("without"), tmp_path_factory.mktemp("with")
    roots = (str(a), str(b))
    without = scrub(run_all(load(a, rp, rp.without_flags()), rp), roots)
    with_flags = scrub(run_all(load(b, rp, flagged(rp, flags, nested)), rp), roots)
    # The one result the flags change: mc_cloud.registry() reports them.
    registry, before = with_flags.pop(REGISTRY), without.pop(REGISTRY)
    for item in ("generic", "lxc", "saltify"):
        key = f"{CLOUD}.{item}"
        # A flat key wins over its nested form, and a pillar key holds one value.
        added = item in flags and key not in rp.without_flags()
        expected = localreg.truthy(flags[item]) if added else before["is"][item]
        assert registry["is"][item] is expected, (item, registry)
    assert with_flags == without


def runner_data(base: Path, rp: RealPillar, pillar: Mapping[str, Any],
                monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What a controller deploy (its data and the lxc hook's), a node deploy
    and a VM provision send to their minions."""
    jobs = Jobs()
    monkeypatch.setattr(transport, "apply_batch", jobs)
    monkeypatch.setattr(transport, "apply_batch_many", jobs.many)
    monkeypatch.setattr(minions, "call", Minions())
    offline = Offline(base, pillar)
    # Copying images to the node is ssh and rsync to another host: not here.
    offline.functions["mc_cloud_lxc.sync_images"] = lambda target, **_: {"result": True, "comment": "skipped"}
    deploy: Callable[[], Any] = lambda: compute_node_deploy(offline.env, rp.cn).as_dict()
    controller = [controller_data(offline.env), lxc.image_sync(offline.env)]
    out = [deploy(), vm_provision(offline.env, rp.vms[0]).as_dict()]
    failed = [o["comment"] for o in out if not o["result"]]
    assert failed == []
    return [*out, jobs.sent, controller]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_runner_data_paths_ignore_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    rp = CORPUS[name]
    a, b = tmp_path / "without", tmp_path / "with"
    roots = (str(a), str(b))
    without = scrub(runner_data(a, rp, rp.without_flags(), monkeypatch), roots)
    with_flags = scrub(runner_data(b, rp, rp.pillar, monkeypatch), roots)
    assert without[2], "the deploy and the provision sent jobs"
    assert with_flags == without
