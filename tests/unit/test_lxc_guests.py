"""How the lxc driver reads the containers of a node (``lxc-ls``), for
``mc_cloud.drift nodes=True``."""

from mccloud.drivers.lxc import parse_lxc_ls


def test_lxc_ls_is_read_with_every_address_and_the_state() -> None:
    text = ("NAME          STATE   IPV4\n"
            "web1.lan      RUNNING 10.5.0.2, 10.5.0.30\n"
            "stopped.lan   STOPPED -\n"
            "\n")
    assert parse_lxc_ls(text) == {
        "web1.lan": {"running": True, "ips": ["10.5.0.2", "10.5.0.30"], "mac": None},
        "stopped.lan": {"running": False, "ips": [], "mac": None},
    }
    assert parse_lxc_ls("") == {}


def test_lxc_ls_tells_a_privileged_container_from_an_unprivileged_one() -> None:
    text = ("NAME     STATE   IPV4                 UNPRIVILEGED \n"
            "web1.lan RUNNING 10.5.0.2, 10.5.0.30  true         \n"
            "dev.lan  STOPPED -                    false        \n")
    assert parse_lxc_ls(text) == {
        "web1.lan": {"running": True, "ips": ["10.5.0.2", "10.5.0.30"], "mac": None, "privileged": False},
        "dev.lan": {"running": False, "ips": [], "mac": None, "privileged": True},
    }


def test_a_guest_running_with_another_privilege_than_the_registry_is_drift() -> None:
    from mccloud.orchestration.repair import guest_findings

    vms = {"web1.lan": {"vt": "lxc", "ip": "10.5.0.2", "privileged": False},
           "dev.lan": {"vt": "lxc", "ip": "10.5.0.3", "privileged": True},
           "old.lan": {"vt": "lxc", "ip": "10.5.0.4", "privileged": False}}
    live = {"web1.lan": {"running": True, "ips": ["10.5.0.2"], "mac": None, "privileged": True},
            "dev.lan": {"running": True, "ips": ["10.5.0.3"], "mac": None, "privileged": True},
            "old.lan": {"running": True, "ips": ["10.5.0.4"], "mac": None}}
    found = guest_findings("cn1", "lxc", vms, live)
    assert found == [{"kind": "guest_privilege_differs", "node": "cn1", "vm": "web1.lan", "what": "privileged",
                      "expected": False, "found": True}]
