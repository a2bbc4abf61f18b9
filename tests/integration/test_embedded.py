"""With no database configured, Ledgerloop starts the embedded Postgres and can migrate it."""

from __future__ import annotations

from pathlib import Path

import psycopg

from ledgerloop.db.embedded import start_embedded
from ledgerloop.db.migrate import schema_state, upgrade


def test_embedded_postgres_starts_and_migrates(tmp_path: Path) -> None:
    url = start_embedded(tmp_path / "pgdata", keep_running=False)
    assert url.startswith("postgresql://")
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    upgrade(url)
    assert schema_state(url).up_to_date
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row == ("ledgerloop",)
    # A second start attaches to the running server instead of failing.
    assert start_embedded(tmp_path / "pgdata", keep_running=False) == url
