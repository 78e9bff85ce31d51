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
