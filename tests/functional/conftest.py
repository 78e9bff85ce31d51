"""Fixtures of the functional tests (masterless ``salt-call``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sls import sls_data


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The data each kind of SLS receives (node, vm, scratch, controller)."""
    return sls_data(tmp_path_factory.mktemp("sls"))
