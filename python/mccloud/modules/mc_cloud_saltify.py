"""Bare-metal targets provisioned with the saltify driver."""

import mccloud
import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_saltify"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """Saltify defaults and ``targets`` (``makina-states.cloud.saltify.targets``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_saltify.settings
    """
    return _ms.open_config(__opts__, __pillar__).saltify_settings()


@_ms.salt_errors
def settings_for_target(name):
    """The settings of one bare-metal target: ssh host, user, key or
    password, bootstrap arguments, gateway.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_saltify.settings_for_target baremetal1.foo.com
    """
    return _ms.open_config(__opts__, __pillar__).saltify_target(str(name))


def gen_id(name):
    """Historical id mangling: replaces every ``.`` by ``-`` and nothing else.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_saltify.gen_id baremetal1.foo.com
    """
    return mccloud.gen_id(str(name))
