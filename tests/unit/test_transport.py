"""Waiting for a minion's return (:func:`transport.one_return`): a job
that ends while the minion is asked whether it still runs it is not lost
when its return reached the job cache meanwhile."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mccloud.orchestration import transport


class Events:
    """A subscription that never delivers the return (read elsewhere)."""

    def get_event(self, wait: float, **_: Any) -> None:
        time.sleep(wait)


class Client:
    """A LocalClient whose job ends while ``saltutil.find_job`` is asked:
    the cache is empty before that question and holds the return after."""

    auto_reconnect = False
    opts = {"gather_job_timeout": 1}

    def __init__(self) -> None:
        self.event = Events()
        self.asked = False

    def run_job(self, *_: Any, **__: Any) -> dict[str, str]:
        return {"jid": "20261128000000000001"}

    def cmd(self, target: str, fun: str, arg: Any, timeout: int) -> dict[str, Any]:
        assert fun == "saltutil.find_job"
        self.asked = True
        return {}

    def get_cache_returns(self, jid: str) -> dict[str, Any]:
        return {"vm.test": {"ret": {"marker": True}, "retcode": 0}} if self.asked else {}


def test_a_return_that_reached_the_job_cache_while_the_minion_was_asked_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "ALIVE_CHECK", 1)
    ended: list[str] = []
    ret = transport.one_return(Client(), "vm.test", "state.highstate", 30, ended=ended)
    assert ret == {"ret": {"marker": True}, "retcode": 0}
    assert ended == []


def test_a_job_that_ended_without_a_return_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "ALIVE_CHECK", 1)
    client = Client()
    client.get_cache_returns = lambda jid: {}  # type: ignore[method-assign]
    ended: list[str] = []
    assert transport.one_return(client, "vm.test", "state.highstate", 30, ended=ended) is None
    assert ended == ["20261128000000000001"]
