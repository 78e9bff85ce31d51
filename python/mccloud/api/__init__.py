"""The controller's self-service API (runner ``mc_cloud_api``): who calls
(:mod:`.identity`), what they may see and do (ownership, in
:mod:`.service`), the envelope every verb answers (:mod:`.envelope`), the
long verbs' detached jobs (:mod:`.jobs`, run by :mod:`.worker`), sealed
passwords (:mod:`.seal`) and ssh keys (:mod:`.sshkey`).

Nothing here reads Salt's dunders: the runner shim passes ``__opts__``,
``__user__`` and its function table in, so the logic is testable without
a master.
"""

from __future__ import annotations
