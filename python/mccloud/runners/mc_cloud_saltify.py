"""Saltify (bare metal) runner."""

import mccloud.drivers.saltify as _saltify
import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_saltify"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def saltify(name, **kwargs):
    """Bootstraps salt on a bare-metal target over ssh with the bootstrap
    script and the target's settings.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_saltify.saltify baremetal1.foo.com
    """
    return _o.run("saltify", _saltify.saltify, _env(), str(name), **kwargs)
