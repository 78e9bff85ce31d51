"""nsbox guests' settings, from the registry every type shares."""

import json
import os
import subprocess

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_nsbox"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def get_settings_for_vm(target, vm):
    """The settings of nsbox guest ``vm`` on compute node ``target``
    (allocating its IP, MAC, password and ports on first call).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_nsbox.get_settings_for_vm node1.lan g1.lan
    """
    return _ms.registry(__opts__, __pillar__).vm_settings(str(target), str(vm))


def guests():
    """The nsbox guests on this node, whoever made them: every network
    namespace named ``mcns-*``, with the IPv4 address and MAC of its
    interface (``{netns: {running, ips, mac}}``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_nsbox.guests
    """
    out = {}
    names = sorted(n for n in os.listdir("/run/netns") if n.startswith("mcns-")) if os.path.isdir("/run/netns") else []
    for ns in names:
        p = subprocess.run(["ip", "-n", ns, "-j", "addr", "show"], capture_output=True, text=True, check=False)
        links = json.loads(p.stdout or "[]") if p.returncode == 0 else []
        ip = mac = None
        for link in links:
            if link.get("ifname") == "lo":
                continue
            mac = link.get("address") or mac
            for a in link.get("addr_info", []):
                if a.get("family") == "inet":
                    ip = a.get("local")
        out[ns] = {"running": p.returncode == 0, "ips": [ip] if ip else [], "mac": mac}
    return out
