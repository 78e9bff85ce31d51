"""makina-states' call forms (COMPAT.md §1) through the real ``salt-call``:
each original signature, positional and with keywords, returning the
original's shape."""

from __future__ import annotations

from typing import Any

from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"
# Declared with its IP in the sample pillar.
FIXED = "gfoobar.test.com"


def ok_both(salt_env: SaltEnv, fun: str, positional: list[str], keywords: list[str]) -> Any:
    """Calls ``fun`` positionally then with keywords; both must agree."""
    first = salt_env.ok(fun, *positional)
    assert salt_env.ok(fun, *keywords) == first, fun
    return first


def test_ports_take_the_vm_first_and_find_its_node(salt_env: SaltEnv) -> None:
    for kind in ("ssh", "snmp"):
        fun = f"mc_cloud_compute_node.get_{kind}_port"
        port = salt_env.ok(fun, VM)
        assert isinstance(port, int)
        assert salt_env.ok(fun, VM, CN) == port
        assert salt_env.ok(fun, f"vm={VM}", f"target={CN}") == port
    wrong = salt_env.call("mc_cloud_compute_node.get_ssh_port", CN, VM)
    assert wrong.returncode != 0 and f"compute node {VM} declares no VMs" in wrong.output


def test_find_functions_take_the_original_arguments(salt_env: SaltEnv) -> None:
    ip = ok_both(salt_env, "mc_cloud_compute_node.find_ip_for_vm", [CN, VM],
                 [f"target={CN}", f"vm={VM}", "virt_type=lxc", "network=10.5.0.0", "netmask=16"])
    assert ip == "10.5.0.2"
    mac = ok_both(salt_env, "mc_cloud_compute_node.find_mac_for_vm", [CN, "lxc", VM],
                  [f"target={CN}", "virt_type=lxc", f"vm={VM}"])
    assert salt_env.ok("mc_cloud_compute_node.find_mac_for_vm", CN, VM) == mac  # mccloud's short form
    password = ok_both(salt_env, "mc_cloud_compute_node.find_password_for_vm", [CN, "lxc", VM],
                       [f"target={CN}", "virt_type=lxc", f"vm={VM}", "pwlen=12"])
    assert len(password) >= 12
    # A network, netmask or type that is not the VM's is refused, saying which.
    for extra, said in (("network=10.9.0.0", "network 10.5.0.0, not 10.9.0.0"),
                        ("virt_type=kvm", "a lxc VM, not kvm")):
        r = salt_env.call("mc_cloud_compute_node.find_ip_for_vm", CN, VM, extra)
        assert r.returncode != 0 and said in r.output, r.output


def test_defaults_are_recorded_only_for_a_vm_without_allocation(salt_env: SaltEnv) -> None:
    other = "gfoobar3.test.com"  # declares its IP but no MAC
    # A VM's first allocation also claims the declared IPs of the node (not
    # its other VMs): the MAC default first, then the IP default.
    mac = salt_env.ok("mc_cloud_compute_node.find_mac_for_vm", CN, "lxc", other, "00:16:3e:01:02:03")
    assert mac == "00:16:3e:01:02:03"
    assert salt_env.ok("mc_cloud_compute_node.find_mac_for_vm", CN, "lxc", other, "00:16:3e:0a:0b:0c") == mac
    ip = salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM, "10.5.0.77")
    assert ip == "10.5.0.77"
    assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM, "10.5.0.78") == "10.5.0.77"
    assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, FIXED, "default=10.5.0.79") == "10.5.10.16"
    # The sample pillar declares this VM's password: the pillar wins.
    assert salt_env.ok("mc_cloud_compute_node.find_password_for_vm", CN, "lxc", other, "default=other") == "foobar"


def test_allocated_ip_record(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    record = salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)
    assert record == {"api": 2, "ips": {}}
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    record = ok_both(salt_env, "mc_cloud_compute_node.get_allocated_ips", [CN], [f"target={CN}"])
    assert record["api"] == 2 and record["ips"][FIXED] == "10.5.10.16" and len(record["ips"]) == 5
    record = salt_env.ok("mc_cloud_compute_node.set_allocated_ip", CN, VM, "10.5.3.3", "lxc")
    assert record["ips"][VM] == "10.5.3.3" and record["api"] == 2
    record = salt_env.ok("mc_cloud_compute_node.set_allocated_ip", f"target={CN}", f"vm={VM}", "ip=10.5.3.4", "vt=lxc")
    assert record["ips"][VM] == "10.5.3.4"
    # remove_allocated_ip frees the IP it is given and returns {vm: ip}.
    left = salt_env.ok("mc_cloud_compute_node.remove_allocated_ip", CN, "10.5.3.4")
    assert VM not in left and left[FIXED] == "10.5.10.16"
    # With vm=, only if that VM holds it.
    salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM)
    held = salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"][VM]
    assert salt_env.ok("mc_cloud_compute_node.remove_allocated_ip", CN, held, f"vm={FIXED}")[VM] == held
    assert VM not in salt_env.ok("mc_cloud_compute_node.remove_allocated_ip", f"target={CN}", f"ip={held}",
                                 f"vm={VM}")
    r = salt_env.call("mc_cloud_compute_node.remove_allocated_ip", CN, VM)
    assert r.returncode != 0 and "is not an IPv4 address" in r.output
    del sample[f"makina-states.services.cloud.lxc.targets.{CN}"][FIXED]
    salt_env.set_pillar(sample)
    # The cleanup plans first, and frees only on the node's word (no master here).
    cleaned = salt_env.ok("mc_cloud_compute_node.cleanup_allocated_ips", CN, "apply=True")
    assert cleaned["api"] == 2 and cleaned["ips"][FIXED] == "10.5.10.16" and cleaned["freed"] == {}, cleaned
    assert [(s["vm"], s["action"], s["ready"]) for s in cleaned["plan"]] == [(FIXED, "free", False)], cleaned


def test_target_data_is_accepted(salt_env: SaltEnv) -> None:
    data = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN,
                       'target_data={"site": "kept", "ssl_certs": [["extra.test", "PEM"]]}')
    assert data["site"] == "kept" and data["ssl_certs"][0] == ["extra.test", "PEM"]
    assert len(data["ssl_certs"]) == 1 + 1 + len(data["domains"])
    for kind in ("ssh", "snmp"):
        kept = salt_env.ok(f"mc_cloud_compute_node.cleanup_{kind}_ports", CN, 'target_data={"vms": {}}')
        assert set(kept) == set(data["vms"])
    r = salt_env.call("mc_cloud_compute_node.cleanup_ssh_ports", CN, "target_data=oops")
    assert r.returncode != 0 and "target_data must be a mapping" in r.output


def test_lookups(salt_env: SaltEnv) -> None:
    assert ok_both(salt_env, "mc_cloud_compute_node.target_for_vm", [VM], [f"vm={VM}"]) == CN
    assert ok_both(salt_env, "mc_cloud_compute_node.vt_for_vm", [VM, CN], [f"vm={VM}", f"target={CN}"]) == "lxc"
    vts = salt_env.ok("mc_cloud_compute_node.get_vts")
    assert vts == {"docker": {}, "xen": {}, "lxc": {"supported": True}, "kvm": {"supported": True}}
    assert salt_env.ok("mc_cloud_compute_node.get_vts", "supported=True") == {"lxc": {"supported": True},
                                                                             "kvm": {"supported": True}}
    assert set(salt_env.ok("mc_cloud_compute_node.get_vts", "False")) == {"docker", "xen"}
    rp = ok_both(salt_env, "mc_cloud_compute_node.get_reverse_proxies_for_target", [CN], [f"target={CN}"])
    assert set(rp) == {"target", "reverse_proxies"} and rp["target"] == CN
    assert salt_env.ok("mc_cloud_saltify.gen_id", "metal1.foo.com") == "metal1-foo-com"


def test_target_settings_carry_the_original_keys(salt_env: SaltEnv) -> None:
    data = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    assert data["virt_types"] == {"lxc": True} and data["firewall"] is True
    assert data["http_proxy_mode"] == "xforwardedfor"
    vm = data["vms"][FIXED]
    assert (vm["virt_type"], vm["vmname"], vm["ip"]) == ("lxc", FIXED, "10.5.10.16")
    rp = data["reverse_proxies"]
    assert rp["target"] == CN
    for proxy, name, prefix in (("http_proxy", CN, "bck"), ("https_proxy", f"secure-{CN}", "securebck")):
        front = rp[proxy]
        assert (front["name"], front["mode"], front["http_proxy_mode"]) == (name, "http", "xforwardedfor")
        assert f"use_backend {prefix}_{FIXED} if host_{FIXED}" in front["raw_opts"]
        backend = rp[f"{proxy[:-6]}_backends"][f"{prefix}_{FIXED}"]
        assert backend["servers"] == [{"name": f"srv_{FIXED}1", "bind": "10.5.10.16:80", "opts": "check"}]
    assert "http-request set-header X-SSL %[ssl_fc]" in rp["https_proxy"]["raw_opts"]
    assert rp["https_proxy"]["bind"] == f"*:443 ssl crt /etc/ssl/cloud/certs/{CN}.crt crt /etc/ssl/cloud/certs"
    snmp = {(e["dport"], e["dest"]) for e in rp["sw_proxies"] if e.get("proto") == "udp" and e["dest"].endswith(":161")}
    assert snmp == {(v["snmp_reverse_proxy_port"], f"lxc:{v['ip']}:161") for v in data["vms"].values()}
    assert {c[0] for c in data["ssl_certs"]} == {CN, *data["domains"]}
