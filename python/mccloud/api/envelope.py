"""The envelope every ``mc_cloud_api`` verb answers: plain JSON with an
HTTP-like ``status``, so salt-api clients (and ``rest_mccloud``, which
turns it into the HTTP status) tell a refusal from an empty answer.

- ``{"ok": true, "status": 200, "data": ...}``
- ``{"ok": true, "status": 202, "data": {"job": "<id>"}}`` (a long verb started a job)
- ``{"ok": false, "status": 400|403|404|409|500|501, "error": "<code>", "reason": "<sentence>"}``
  (500 ``server_error``: the controller failed, not the caller: its store,
  its pillar or its ``mccloud_api`` option; the reason says what to ask the
  operator)
"""

from __future__ import annotations

from typing import Any

#: The error code of each failure status.
ERRORS = {400: "bad_request", 403: "forbidden", 404: "not_found", 409: "conflict", 500: "server_error",
          501: "unsupported"}


class ApiError(Exception):
    """A refusal or failure a verb answers as an envelope (never a
    traceback): ``status`` is one of :data:`ERRORS`, ``reason`` a sentence
    naming the user, the object and what to do."""

    status = 400

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if status is not None:
            self.status = status

    @property
    def error(self) -> str:
        return ERRORS.get(self.status, "bad_request")


class BadRequest(ApiError):
    status = 400


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class ServerError(ApiError):
    """The controller failed (store or pillar down, a broken master
    option): not the caller's fault."""

    status = 500


class Unsupported(ApiError):
    status = 501


def ok(data: Any, status: int = 200) -> dict[str, Any]:
    """A success envelope."""
    return {"ok": True, "status": status, "data": data}


def started(job: str) -> dict[str, Any]:
    """The envelope of a verb that started job ``job`` (202)."""
    return ok({"job": job}, 202)


def failure(err: ApiError) -> dict[str, Any]:
    """The envelope of ``err``."""
    return {"ok": False, "status": err.status, "error": err.error, "reason": err.reason}


def is_failure(envelope: Any) -> bool:
    """Whether ``envelope`` reports a failure."""
    return isinstance(envelope, dict) and envelope.get("ok") is False
