"""Shared fixtures: throw-away masterless Salt configurations (the helpers
live in ``tests/support``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from mccloud.cli import sample_pillar, write_masterless_config
from tests.support.dnsservers import dns_bind, dns_bind_secondary, dns_knot, dns_pdns  # noqa: F401 (session fixtures)
from tests.support.saltenv import SaltEnv


@pytest.fixture(autouse=True, scope="session")
def _store_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The key file of the stores' secrets for every registry the tests
    open (``$MCCLOUD_STORE_KEY``, which the processes they start inherit):
    a temporary one, never the default beside a CA under /srv."""
    key = tmp_path_factory.mktemp("store-key") / "mccloud-store.key"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCCLOUD_STORE_KEY", str(key))
        yield key


@pytest.fixture
def salt_env(tmp_path: Path) -> SaltEnv:
    """A masterless configuration holding the makina-states documentation's sample pillar."""
    conf = write_masterless_config(str(tmp_path), sample_pillar())
    return SaltEnv(tmp_path, Path(conf))


@pytest.fixture
def sample() -> dict[str, Any]:
    return yaml.safe_load(sample_pillar())


class _LoopbackOnly:
    """Stands in for pytest-skip-markers' ``platform`` inside the
    salt-factories log server and event listener, whose only use of it is to
    pick 127.0.0.1 instead of 0.0.0.0: tests listen on loopback only."""

    @staticmethod
    def is_windows() -> bool:
        return True


def _bind_factories_to_loopback() -> None:
    try:
        from saltfactories.plugins import event_listener, log_server
    except ImportError:  # pragma: no cover - salt-factories not installed
        return
    event_listener.platform = _LoopbackOnly  # type: ignore[assignment]
    log_server.platform = _LoopbackOnly  # type: ignore[assignment]


_bind_factories_to_loopback()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Salt's log handlers flush once more at interpreter exit, after pytest
    # closed the streams it captured: nothing is lost, but logging would print
    # a traceback for each record.
    import logging

    logging.raiseExceptions = False
