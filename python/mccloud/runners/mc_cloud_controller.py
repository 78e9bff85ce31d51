"""Controller runners: deploy the controller, orchestrate the whole cloud."""

import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_controller"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def deploy(**kwargs):
    """Controller layout, its ssh key pair, then each driver's controller hook.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_controller.deploy
    """
    return _o.run("deploy", _o.controller_deploy, _env(), **kwargs)


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
