"""Cloud-controller settings."""

import mccloud
import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_controller"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """Controller settings (controller id, virtualisation types, ssh key).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.settings
    """
    return _ms.config(__opts__, __pillar__).controller_settings()


def gen_id(name):
    """Historical id mangling: replaces every ``.`` by ``-`` and nothing else.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_controller.gen_id devhost10.local
    """
    return mccloud.gen_id(str(name))
