"""The run store's side of retention: finding finished runs page by page, and removing them.

The purge itself (both schemas, batches, the continuous setting) is ledgerloop.retention.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.runs")

#: Where a purge's keyset cursor starts: before every run.
CURSOR_START: tuple[datetime, uuid.UUID] = (datetime(1970, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


def runs_finished_page(
    conn: Conn,
    *,
    cutoff: datetime,
    after: tuple[datetime, uuid.UUID],
    limit: int,
    with_journal_only: bool,
) -> list[tuple[datetime, uuid.UUID]]:
    """Up to `limit` runs that finished before `cutoff`, after the cursor, oldest first."""
    query = "runs_finished_with_journal_page" if with_journal_only else "runs_finished_page"
    rows = conn.execute(
        Q[query],
        {"cutoff": cutoff, "after_at": after[0], "after_id": after[1], "limit": limit},
    ).fetchall()
    return [(row["updated_at"], row["id"]) for row in rows]


def runs_delete_finished(conn: Conn, ids: list[uuid.UUID]) -> int:
    """Delete finished runs with everything they own in schema ledgerloop; returns the count."""
    row = conn.execute(Q["runs_delete_finished"], {"ids": ids}).fetchone()
    return int(row["deleted"]) if row else 0


def runs_mark_journal_purged(conn: Conn, ids: list[uuid.UUID]) -> int:
    return conn.execute(Q["runs_mark_journal_purged"], {"ids": ids}).rowcount
