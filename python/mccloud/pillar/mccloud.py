"""The ``mccloud`` ext_pillar: each minion's own job data.

Runners deposit what a ``state.sls`` job needs (keys, certificates, hashes)
on the controller and publish only a token; this pillar hands a minion the
deposits addressed to it, under ``mccloud_private:<token>``, in its own
pillar, which Salt encrypts for that minion alone (see
:mod:`mccloud.orchestration.private`).

Master configuration:

.. code-block:: yaml

    ext_pillar:
      - mccloud: {}
"""

from __future__ import annotations

from typing import Any

from mccloud.orchestration import private as _private

__virtualname__ = "mccloud"


def __virtual__() -> str:
    return __virtualname__


def ext_pillar(minion_id: str, pillar: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``{mccloud_private: {token: data}}`` for the deposits addressed to
    ``minion_id`` (nothing when there are none)."""
    found = _private.collect(__opts__, str(minion_id))  # type: ignore[name-defined]  # noqa: F821
    return {_private.PILLAR_KEY: found} if found else {}
