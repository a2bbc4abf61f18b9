"""Fixtures shared by the crash tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledgerloop.db.cluster import LocalCluster
from tests.support.clusters import own_cluster


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A Postgres cluster of the test's own: crash tests stop and restart it."""
    with own_cluster() as cluster:
        yield cluster
