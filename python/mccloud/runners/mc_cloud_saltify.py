"""Saltify (bare metal) runner."""

import mccloud.drivers.saltify as _saltify
import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_saltify"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


@_o.strict
def saltify(name, **kwargs):
    """Makes a bare-metal target a minion of the master of its mode over
    ssh (``ssh_keyfile``, or ``password`` through sshpass): pre-seeds and
    accepts its key, sends its minion configuration, keys and the
    bootstrap script (``script``; mccloud's own by default), plus the Salt
    wheelhouse when the target has no Salt, runs the script with
    ``script_args``, and waits until the target answers ``test.ping``. The
    target's ``master``/``master_port`` default to the cloud's.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_saltify.saltify baremetal1.foo.com
    """
    return _saltify.SaltifyDriver(_env()).saltify(str(name))
