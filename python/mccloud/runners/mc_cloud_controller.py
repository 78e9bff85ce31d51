"""Controller runners: deploy the controller, orchestrate the whole cloud."""

import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_controller"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


@_o.strict
def deploy(**kwargs):
    """Controller layout, its ssh key pair, then each driver's controller hook.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_controller.deploy
    """
    return _o.run("deploy", _o.controller_deploy, _env(), **kwargs)


@_o.strict
def orchestrate(only=None, skip=None, **kwargs):
    """The controller, then the saltify targets, then every compute node and
    its VMs. ``only``/``skip``: comma-separated phases (controller, saltify,
    compute_nodes, vms) or target ids.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_controller.orchestrate
        mastersalt-run mc_cloud_controller.orchestrate skip=vms
    """
    return _o.run("orchestrate", _o.cloud_orchestrate, _env(), only, skip, **kwargs)


@_o.strict
def wheelhouse(force=False, **kwargs):
    """Builds the Salt wheelhouse VMs and bare-metal targets install Salt
    from (Salt at the controller's version and its dependencies, as wheels,
    with ``SHA256SUMS``), with pip: once; an intact one of the right version
    is kept unless ``force``. Master options ``mccloud_wheelhouse`` (the
    directory) and ``mccloud_wheelhouse_target`` (another Python/platform).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_controller.wheelhouse
        mastersalt-run mc_cloud_controller.wheelhouse force=True
    """
    return _o.run("wheelhouse", _o.wheelhouse, _env(), force, **kwargs)
