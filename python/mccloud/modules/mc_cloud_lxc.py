"""The lxc registry: lxc settings and per-VM settings."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_lxc"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """lxc defaults, size profiles, profile types and ``vms`` as
    ``{cn: [vm, ...]}``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_lxc.settings
    """
    return _ms.open_config(__opts__, __pillar__).lxc_settings()


@_ms.salt_errors
def get_settings_for_vm(target, vm, full=True):
    """The merged settings of a VM on compute node ``target``. Allocates its
    IP, MAC(s) and password on first call, and its ssh/snmp reverse-proxy
    ports too when ``full``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_lxc.get_settings_for_vm devhost10.local mysupertest3.foo.com
    """
    full = _ms.boolean("full", full)
    return _ms.open_registry(__opts__, __pillar__, place="rest").vm_settings(str(target), str(vm), full)


def _move_errors(func):
    """A refused copy is Salt's CommandExecutionError, naming why."""
    import functools

    import mccloud.lxcmove as _lxcmove
    import mccloud.saltcompat as _saltcompat

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **{k: v for k, v in kwargs.items() if not k.startswith("__")})
        except _lxcmove.MoveError as exc:
            raise _saltcompat.exceptions().CommandExecutionError(str(exc)) from None

    return wrapper


@_move_errors
def move_copy(src, dst):
    """Copies a container's directory ``src`` to ``dst`` on this node,
    exactly (rsync: hard links, ACLs, extended attributes, numeric ids,
    deletions); ``seconds`` and ``bytes`` sent. Run by ``mc_cloud.move``.

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_lxc.move_copy /var/lib/lxc/web.example.net /srv/lxc2/web.example.net
    """
    import mccloud.lxcmove as _lxcmove

    return _lxcmove.copy(str(src), str(dst))


@_move_errors
def move_prepare(dst):
    """Checks that a move may copy into ``dst`` on this node and marks it
    as a move's (a directory no move made, or a running container, is
    refused). Run by ``mc_cloud.move`` before the controller copies into
    it from another machine.

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_lxc.move_prepare /var/lib/lxc/web.example.net
    """
    import mccloud.lxcmove as _lxcmove

    return {"mark": _lxcmove.prepare(str(dst))}


@_move_errors
def move_repoint(config, old, new):
    """Points the lxc configuration ``config`` of a container copied from
    directory ``old`` to ``new`` at its own files (root filesystem,
    included fragments).

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_lxc.move_repoint /srv/lxc2/web/config /var/lib/lxc/web /srv/lxc2/web
    """
    import mccloud.lxcmove as _lxcmove

    return {"changed": _lxcmove.repoint(str(config), str(old), str(new))}


@_move_errors
def move_minion_config(rootfs, path, text):
    """Writes the minion configuration ``text`` at ``path`` inside the
    root filesystem ``rootfs`` of a stopped container (never following a
    link the container planted): the master address of the node it moved
    to. A container without that file (not a minion) is left as it is.
    Run by ``mc_cloud.move``.

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_lxc.move_minion_config /srv/lxc2/web/rootfs /etc/salt/minion.d/mccloud.conf '...'
    """
    import mccloud.lxcmove as _lxcmove
    import mccloud.rootfs as _rootfs

    try:
        if _rootfs.regular(str(rootfs), str(path)) is None:
            return {"changed": False, "comment": f"no minion configuration {path} in the copy: not a minion"}
        return {"changed": _rootfs.write(str(rootfs), str(path), str(text).encode(), makedirs=False)}
    except _rootfs.RootfsError as exc:
        raise _lxcmove.MoveError(f"the minion configuration of the copy in {rootfs}: {exc}") from None


@_move_errors
def guest_stop(lxc_path, name, timeout=60):
    """Stops container ``name`` of ``lxc_path`` (cleanly, within
    ``timeout`` seconds, then killed); ``seconds``. Run by ``mc_cloud.move``."""
    import mccloud.lxcmove as _lxcmove

    return _lxcmove.lxc(["lxc-stop", "-P", str(lxc_path), "-n", str(name), "-t", str(int(timeout))],
                        f"stopping {name}", allow={2})


@_move_errors
def guest_start(lxc_path, name):
    """Starts container ``name`` of ``lxc_path`` (one running already is
    left so) and waits until it runs. Run by ``mc_cloud.move``."""
    import mccloud.lxcmove as _lxcmove

    if not _lxcmove.running(str(lxc_path), str(name)):
        _lxcmove.lxc(["lxc-start", "-P", str(lxc_path), "-n", str(name)], f"starting {name}")
    return _lxcmove.lxc(["lxc-wait", "-P", str(lxc_path), "-n", str(name), "-s", "RUNNING", "-t", "60"],
                        f"waiting for {name} to run")


@_move_errors
def wait_port(host, port, timeout=120):
    """Waits until ``host:port`` (a guest on this node's bridge) accepts a
    connection; ``seconds``. Run by ``mc_cloud.move``."""
    import mccloud.lxcmove as _lxcmove

    return _lxcmove.wait_port(str(host), int(port), float(timeout))


@_move_errors
def guest_remove(lxc_path, name, keep=None):
    """Removes the stopped container ``name`` of ``lxc_path`` once it moved
    away (``lxc-destroy``: its directory only). Refuses a running one, and
    one whose directory is ``keep`` (the moved container's, on its new
    node: the same directory under another path). Run by ``mc_cloud.move``
    after its switch.

    CLI Example:

    .. code-block:: bash

        salt node1 mc_cloud_lxc.guest_remove /var/lib/lxc web.example.net
    """
    import os

    import mccloud.lxcmove as _lxcmove

    path = os.path.join(str(lxc_path), str(name))
    if not os.path.isdir(path):
        return {"seconds": 0.0, "comment": f"no container {name} under {lxc_path}"}
    if keep and os.path.exists(str(keep)) and os.path.samefile(path, str(keep)):
        raise _lxcmove.MoveError(f"{path} is the moved container's own directory ({keep}): not removed")
    if _lxcmove.running(str(lxc_path), str(name)):
        raise _lxcmove.MoveError(f"container {name} of {lxc_path} runs: not removed")
    return _lxcmove.lxc(["lxc-destroy", "-P", str(lxc_path), "-n", str(name)], f"removing {name}")
