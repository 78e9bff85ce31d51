"""Units of the runners' shared logic: step resolution and result mappings,
and the haproxy configuration built for several VMs (checked by haproxy)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

import mccloud
from mccloud.orchestration import VM_STEPS, Outcome, run_steps, step_functions


def recorder(calls: list[str], fail: str | None = None) -> Callable[[str], Callable[..., dict[str, Any]]]:
    def make(name: str) -> Callable[..., dict[str, Any]]:
        def fn(*args: Any) -> dict[str, Any]:
            calls.append(name)
            return {"result": name != fail, "comment": f"{name} ran"}
        return fn
    return make


def test_step_resolution_order_and_missing_functions() -> None:
    available = {"mc_cloud_lxc.vm_spawn", "mc_cloud_vm.vm_spawn", "mc_cloud_lxc.post_vm_spawn",
                 "mc_cloud_vm.vm_fix_dns", "mc_cloud_kvm.vm_spawn"}
    assert step_functions(available, "lxc", "spawn") == [
        "mc_cloud_lxc.vm_spawn", "mc_cloud_vm.vm_spawn", "mc_cloud_lxc.post_vm_spawn"]
    assert step_functions(available, "lxc", "fix_dns") == ["mc_cloud_vm.vm_fix_dns"]
    assert step_functions(available, "lxc", "volumes") == []
    assert step_functions(available, "kvm", "spawn") == ["mc_cloud_kvm.vm_spawn", "mc_cloud_vm.vm_spawn"]


def test_steps_run_in_order_and_stop_at_the_first_failure() -> None:
    calls: list[str] = []
    names = ["mc_cloud_lxc.vm_spawn", "mc_cloud_vm.vm_fix_dns", "mc_cloud_lxc.post_vm_fix_dns",
             "mc_cloud_lxc.vm_reconfigure", "mc_cloud_vm.vm_preprovision"]
    make = recorder(calls, fail="mc_cloud_lxc.post_vm_fix_dns")
    out = run_steps({n: make(n) for n in names}, "lxc", VM_STEPS, ("vm", "cn"), lambda m: None)
    assert calls == ["mc_cloud_lxc.vm_spawn", "mc_cloud_vm.vm_fix_dns", "mc_cloud_lxc.post_vm_fix_dns"]
    assert out.result is False and "step fix_dns (mc_cloud_lxc.post_vm_fix_dns) failed" in out.comment
    d = out.as_dict()
    assert d["retcode"] == 1 and [s["result"] for s in d["steps"]] == [True, True, False]


def test_outcome_mapping() -> None:
    out = Outcome()
    out.add("a", {"result": True, "changes": {"x": 1}})
    assert out.as_dict() == {"result": True, "comment": "1 step(s) succeeded", "changes": {"a": {"x": 1}},
                             "steps": [{"name": "a", "result": True, "changes": {"x": 1}}], "retcode": 0}


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is installed by ./run setup")
def test_haproxy_config_for_shared_and_wildcard_domains(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    cert = tmp_path / "certs" / "cert.pem"
    subprocess.run(
        f"openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=t -keyout {cert}.k -out {cert}.c"
        f" 2>/dev/null && cat {cert}.c {cert}.k > {cert} && rm {cert}.c {cert}.k", shell=True, check=True,
    )
    cn = "cn1.example.net"
    pillar = {
        f"makina-states.cloud.lxc.vms.{cn}": {
            "a.example.net": {"domains": ["*.shared.org", "www.a.org"]},
            "b.example.net": {"domains": ["*.shared.org", "www.a.org"]},
            "c.example.net": {"domains": ["*"]},
        },
        f"makina-states.cloud.compute_node.conf.{cn}": {
            "ssl_cert": str(cert), "ssl_certs_dir": str(tmp_path / "certs"), "bind_address": "127.0.0.1",
            "http_proxy": {"raw_opts_pre": ["timeout client 2m"], "raw_opts_post": ["http-request set-header X-Via mccloud"]},
        },
    }
    reg = mccloud.Registry(mccloud.Config({"minion_id": "ctl"}, pillar), str(tmp_path / "store"))
    t = reg.target_settings(cn)
    cfg = t["reverse_proxies"]["haproxy_cfg"]
    (tmp_path / "haproxy.cfg").write_text(cfg)
    check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr + cfg
    assert cfg.count("\nbackend bck_www.a.org\n") == 1 and cfg.count("\nbackend securebck_www.a.org\n") == 1
    shared = cfg.split("\nbackend bck__star.shared.org\n")[1].split("\n\n")[0]
    assert "server srv__star.shared.org1 " in shared and "server srv__star.shared.org2 " in shared
    assert "acl host__star.shared.org req.hdr(host),field(1,:) -m end -i .shared.org" in cfg
    assert "acl host__star always_true" in cfg
    # exact names are matched before wildcards
    assert cfg.index("acl host_www.a.org") < cfg.index("acl host__star.shared.org") < cfg.index("acl host__star ")
    assert "    timeout client 2m\n" in cfg and "http-request set-header X-Via mccloud" in cfg
    for vm, v in t["vms"].items():
        assert f"bind 127.0.0.1:{v['ssh_reverse_proxy_port']}\n    mode tcp\n    server {vm} {v['ip']}:22" in cfg


def test_a_node_with_conflicting_vms_is_deployed_but_fails_naming_them() -> None:
    from mccloud.orchestration import Outcome, with_conflicts

    done = Outcome()
    done.add("reverse_proxy", {"result": True, "comment": "applied"})
    out = with_conflicts(done, {"errors": {"b.test": "IP 10.5.0.9 declared for b.test is held by a.test"}}).as_dict()
    assert out["result"] is False and out["retcode"] == 1
    assert [s["name"] for s in out["steps"]] == ["reverse_proxy", "conflicts"]
    assert "b.test left out" in out["comment"] and "10.5.0.9" in out["comment"]
    assert with_conflicts(Outcome(), {"errors": {}}).as_dict()["result"] is True


def test_a_thread_keeps_its_local_client_until_a_call_fails_or_it_is_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call of a provisioning reuses its thread's LocalClient (a new one
    builds three of Salt's loaders); another thread gets its own, and a
    failed call or an old client is not reused."""
    import threading

    from mccloud.orchestration import transport

    conf = tmp_path / "master"
    conf.write_text(f"root_dir: {tmp_path / 'root'}\n")
    path = str(conf)
    with transport.local_client(path) as first:
        pass
    with transport.local_client(path) as again:
        assert again is first
    other: list[Any] = []
    thread = threading.Thread(target=lambda: other.append(transport.local_client(path).__enter__()))
    thread.start()
    thread.join()
    assert other and other[0] is not first
    with pytest.raises(RuntimeError), transport.local_client(path) as failing:
        assert failing is first
        raise RuntimeError("the call failed")
    assert first.event is None, "a client through which a call failed is destroyed"
    with transport.local_client(path) as fresh:
        assert fresh is not first
    monkeypatch.setattr(transport, "CLIENT_KEPT", -1)
    with transport.local_client(path) as newer:
        assert newer is not fresh
    assert fresh.event is None, "an old client is destroyed, not reused"
