"""The kvm registry (kvm settings and per-VM settings) and what a compute
node tells of its kvm guests (see :mod:`mccloud.kvmnode`)."""

import mccloud.kvmnode as _kvmnode
import mccloud.saltcompat as _saltcompat
import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_kvm"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """kvm defaults (``kvm_path``, ``bridge``, ``image``, ``cpus``,
    ``memory``, ``size``, ``accel``…) and ``vms`` as ``{cn: [vm, ...]}``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_kvm.settings
    """
    from mccloud.drivers import kvm as _kvm  # the runners' side: imported only when asked

    return _kvm.settings(_ms.open_config(__opts__, __pillar__))


@_ms.salt_errors
def get_settings_for_vm(target, vm, full=True):
    """The merged settings of a kvm VM on compute node ``target``, its
    ``domain`` (the QEMU argv and paths) included. Allocates its IP, MAC(s)
    and password on first call, and its ssh/snmp reverse-proxy ports too
    when ``full``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_kvm.get_settings_for_vm devhost10.local vm1.example.net
    """
    full = _ms.boolean("full", full)
    return _ms.open_registry(__opts__, __pillar__, place="rest").vm_settings(str(target), str(vm), full)


def accel():
    """``kvm`` when this node's ``/dev/kvm`` opens and answers, else ``tcg``
    (grain ``mccloud_kvm_accel``).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_kvm.accel
    """
    return _kvmnode.accel()


def guests(paths=None):
    """The kvm guests of this node, whoever started them: every VM
    directory ``<kvm_path>/vms/<vm>`` with a ``domain.json`` under the kvm
    paths ``paths`` (a list; default ``/var/lib/mccloud/kvm``), named after
    its VM, and every other QEMU process as ``qemu:<name or pid>``:
    ``{name: {running, ips, mac}}`` (``ips`` is empty: QEMU cannot tell).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_kvm.guests '["/var/lib/mccloud/kvm"]'
    """
    if paths is None:
        paths = [_kvmnode.DEFAULT_KVM_PATH]
    elif isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise _invocation_error(f"paths must be a list of absolute kvm paths, not {paths!r}")
    return _kvmnode.guests(paths)


def locate(name, paths=None):
    """Where VM ``name`` lives on this node: ``dir``, the first
    ``<kvm_path>/vms/<name>`` directory under the kvm paths ``paths`` (a
    list, looked in first), those of ``/etc/mccloud/kvm-paths`` and the
    default one (None when it is under none), and ``guests``, the pids of
    every QEMU process named ``guest=<name>`` (the destroy refuses to free
    a VM whose guest runs from a directory it cannot find).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_kvm.locate vm1.example.net '["/srv/kvm"]'
    """
    if paths is None:
        paths = []
    elif isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, (list, tuple)):
        raise _invocation_error(f"paths must be a list of kvm paths, not {paths!r}")
    name = str(name)
    candidates = _kvmnode.node_kvm_paths([str(p) for p in paths])
    return {"dir": _kvmnode.locate(name, candidates), "paths": candidates, "guests": _kvmnode.guest_pids(name)}


def stop(name, dir, timeout=60):  # noqa: A002 - the VM directory, as the states name it
    """Stops kvm guest ``name`` whose VM directory is ``dir``: QMP
    ``system_powerdown``, up to ``timeout`` seconds, then SIGTERM, then
    SIGKILL. Answers ``{stopped, how, comment}``.

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_kvm.stop vm1.example.net /var/lib/mccloud/kvm/vms/vm1.example.net
    """
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        raise _invocation_error(f"timeout must be a number of seconds, not {timeout!r}") from None
    try:
        return _kvmnode.stop(str(name), str(dir), seconds)
    except _kvmnode.KvmNodeError as exc:
        raise _saltcompat.exceptions().CommandExecutionError(str(exc)) from None


def console(dir, lines=20):  # noqa: A002 - the VM directory, as the states name it
    """The last ``lines`` lines (at most 200) of the serial console log of
    the kvm guest whose VM directory is ``dir``: what its kernel and init
    said last (a guest that does not answer on the network says why
    there). Answers ``{"lines": [...]}``.

    CLI Example:

    .. code-block:: bash

        salt node1 mc_cloud_kvm.console /var/lib/mccloud/kvm/vms/vm1.example.net lines=50
    """
    try:
        n = int(lines)
    except (TypeError, ValueError):
        raise _invocation_error(f"lines must be a number of lines, not {lines!r}") from None
    return {"lines": _kvmnode.console_tail(str(dir), n)}


def _invocation_error(message):
    return _saltcompat.exceptions().SaltInvocationError(message)


def _move(func):
    """A refused move step is Salt's CommandExecutionError, naming why."""
    import functools

    import mccloud.lxcmove as _lxcmove

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **{k: v for k, v in kwargs.items() if not k.startswith("__")})
        except (_lxcmove.MoveError, _kvmnode.KvmNodeError) as exc:
            raise _saltcompat.exceptions().CommandExecutionError(str(exc)) from None

    return wrapper


@_move
def move_copy(src, dst):
    """Copies kvm VM directory ``src`` (``<kvm_path>/vms/<vm>``: its disk
    overlay, kernel copies, seed) to ``dst`` on this node, exactly, its
    QEMU's pidfile and QMP socket left out; ``seconds`` and ``bytes``
    sent. Never into a directory no move made, nor under a running guest.
    Run by ``mc_cloud.move``.

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_kvm.move_copy /var/lib/mccloud/kvm/vms/vm1.example.net /srv/kvm2/vms/vm1.example.net
    """
    import mccloud.lxcmove as _lxcmove

    return _lxcmove.copy(str(src), str(dst), kvm=True)


@_move
def move_prepare(dst):
    """Checks that a move may copy kvm VM directory ``dst`` into this node
    and marks it as a move's; run by ``mc_cloud.move`` before the
    controller copies into it from another machine.

    CLI Example:

    .. code-block:: bash

        salt node2 mc_cloud_kvm.move_prepare /srv/kvm2/vms/vm1.example.net
    """
    import mccloud.lxcmove as _lxcmove

    return {"mark": _lxcmove.prepare(str(dst), kvm=True)}


@_move
def guest_remove(name, dir, keep=None):  # noqa: A002 - the VM directory, as the states name it
    """Removes kvm VM ``name``'s directory ``dir`` once the VM moved away,
    and its taps still on the bridge that directory names. Refuses a guest
    running from it, and the directory ``keep`` (the moved VM's own).
    Run by ``mc_cloud.move`` after its switch.

    CLI Example:

    .. code-block:: bash

        salt node1 mc_cloud_kvm.guest_remove vm1.example.net /var/lib/mccloud/kvm/vms/vm1.example.net
    """
    import mccloud.lxcmove as _lxcmove

    return _lxcmove.remove_kvm(str(name), str(dir), str(keep) if keep else None)
