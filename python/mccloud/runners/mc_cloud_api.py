"""The controller's self-service API (through salt-api's runner client, or
``salt-run`` on the controller): inventory, VM access, ssh keys, DNS
names, storage, provision and destroy, nodes linked and unlinked, jobs.

Every verb answers an envelope ``{"ok", "status", "data"}`` or ``{"ok":
false, "status", "error", "reason"}`` (docs/reference/runners.md); the
caller is Salt's authenticated user, its groups resolved per the master
option ``mccloud_api``. The logic is :mod:`mccloud.api.service`."""

from mccloud.api import service as _service
from mccloud.api.envelope import BadRequest as _BadRequest
from mccloud.api.envelope import failure as _failure

__virtualname__ = "mc_cloud_api"


def __virtual__():
    return __virtualname__


def _call(verb, kwargs, **given):
    stray = sorted(k for k in kwargs if not str(k).startswith("__"))
    if stray:
        __context__["retcode"] = 1
        why = (f"mc_cloud_api.{verb}: unexpected argument {', '.join(stray)}; it takes "
               f"{', '.join(given) or 'no argument'}")
        return {**_failure(_BadRequest(why)), "retcode": 1}
    return _service.call(verb, __opts__, globals().get("__user__"), __salt__, __context__, **given)


def whoami(**kwargs):
    """The caller: its user, groups, whether it is an admin and the verbs it may call.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.whoami
    """
    return _call("whoami", kwargs)


def nodes(**kwargs):
    """The compute nodes the caller sees (its groups own the node or a VM on
    it): name, IP, DNS, types, owners, capacity (IPs, ssh and snmp ports
    used and free) and how many of its VMs are there.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.nodes
    """
    return _call("nodes", kwargs)


def node(name=None, **kwargs):
    """One compute node (as in ``nodes``) with the names of the caller's VMs on it.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.node devhost10.local
    """
    return _call("node", kwargs, name=name)


def vms(node=None, owner=None, **kwargs):
    """The caller's VMs (of one ``node``, of one ``owner`` group): name,
    node, type, state, IP, ssh access (``ssh -p PORT root@NODE``), DNS
    names and owners. A node or group the caller may not see is a 403.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.vms
        salt-run mc_cloud_api.vms owner=teama
    """
    return _call("vms", kwargs, node=node, owner=owner)


def vm(name=None, **kwargs):
    """One VM (as in ``vms``) with its limits, who declared it and its last jobs.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.vm web1.example.com
    """
    return _call("vm", kwargs, name=name)


def password(name=None, pubkey=None, **kwargs):
    """The VM's root password, sealed with RSA-OAEP-SHA256 to ``pubkey``
    (base64 SPKI of the caller's RSA key): ``{"sealed": base64}``. Never in
    clear, for no one (the master fires every runner's return on its event
    bus): on the controller, ``mccloud inventory --vm NAME -o json`` reads
    it from the store. Always journaled (``password_read``), never the value.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.password web1.example.com pubkey=MIIBIjANBg...
    """
    return _call("password", kwargs, name=name, pubkey=pubkey)


def add_ssh_key(name=None, key=None, user="root", **kwargs):
    """Installs an ssh public key (one ``TYPE BASE64 [COMMENT]`` line, no
    options) for ``user`` of the VM, through the VM's own minion.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.add_ssh_key web1.example.com key='ssh-ed25519 AAAA... alice@laptop'
    """
    return _call("add_ssh_key", kwargs, name=name, key=key, user=user)


def link_dns(name=None, dns=None, **kwargs):
    """Adds DNS names to a VM declared through the API, then a job
    publishes them (the node's reverse proxy, DNS). A VM declared in the
    pillar files is a 409: add the names there. Names are stored
    lower-case; a non-admin may not claim a wildcard (403) nor a name a VM
    or node it does not own uses (409).

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.link_dns web1.example.com dns=www.example.com,shop.example.com
    """
    return _call("link_dns", kwargs, name=name, dns=dns)


def storage(name=None, action="list", size=None, volume=None, **kwargs):
    """The VM's storage (``action=list``: its root filesystem's backing and
    size, its bind mounts); ``add``/``free`` answer what the backing allows
    (501 naming the backing and what to use instead when it allows nothing).

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.storage web1.example.com
    """
    return _call("storage", kwargs, name=name, action=action, size=size, volume=volume)


def provision(name=None, node=None, image=None, owners=None, domains=None, **kwargs):
    """Provisions a VM: an existing one again, or a new one on ``node``
    (declared through the API with ``owners``, default the caller's groups,
    ``image`` and ``domains``). Answers 202 and the job to follow.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.provision web2.example.com node=devhost10.local owners=teama
    """
    return _call("provision", kwargs, name=name, node=node, image=image, owners=owners, domains=domains)


def destroy(name=None, **kwargs):
    """Destroys a VM (``mc_cloud_vm.destroy`` in a job). Answers 202 and the job to follow.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.destroy web2.example.com
    """
    return _call("destroy", kwargs, name=name)


def link_node(name=None, ip=None, ssh_username="root", owners=None, **kwargs):
    """Admins: declares a compute node through the API and links it (saltify
    then deploy, in a job). Answers 202 and the job to follow.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.link_node devhost11.local ip=192.0.2.11 owners=teama
    """
    return _call("link_node", kwargs, name=name, ip=ip, ssh_username=ssh_username, owners=owners)


def unlink_node(name=None, **kwargs):
    """Admins: removes a compute node declared through the API, once it has no VM.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.unlink_node devhost11.local
    """
    return _call("unlink_node", kwargs, name=name)


def job(id=None, **kwargs):  # noqa: A002 - the verb's documented argument
    """A job: its kind, target, user, state (running, succeeded, failed,
    lost), progress messages and result.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.job 20261128T050000123-1a2b3c
    """
    return _call("job", kwargs, id=id)


def jobs(limit=50, **kwargs):
    """The caller's jobs (those on its VMs), newest first.

    CLI Example:

    .. code-block:: bash

        salt-run mc_cloud_api.jobs
    """
    return _call("jobs", kwargs, limit=limit)
