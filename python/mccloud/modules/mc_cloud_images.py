"""Images (template containers) of each virtualisation type."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_images"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """lxc images, the default image first.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_images.settings
    """
    return _ms.open_config(__opts__, __pillar__).images_settings()
