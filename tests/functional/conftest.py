"""Fixtures of the functional tests (masterless ``salt-call``)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support.postgres import Postgres
from tests.support.sls import sls_data


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The data each kind of SLS receives (node, vm, scratch, controller)."""
    return sls_data(tmp_path_factory.mktemp("sls"))


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    """A PostgreSQL server of the module's own (``tests.support.postgres``)."""
    with Postgres.running() as pg:
        yield pg
