"""Clusters of a test's own, for crash tests that stop, restart or starve Postgres itself."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.migrate import upgrade
from ledgerloop.db.url import with_database


@contextmanager
def own_cluster(prefix: str = "ledgerloop-cluster-") -> Iterator[LocalCluster]:
    """A started throwaway cluster, destroyed afterwards."""
    # Under /tmp, not pytest's private tmp_path: the cluster runs as another system user.
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.destroy()


def migrated_database(cluster: LocalCluster, name: str = "ledgerloop") -> str:
    """Create database `name` on `cluster`, migrate it, and return its URL."""
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(cluster.url, name)
    upgrade(url)
    return url
