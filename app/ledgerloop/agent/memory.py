"""Conversation memory: loaded once per run (memory-load), saved with the run's final answer
(by its think step, or memory-save-{i}) or its end (finish), and when an answer is rejected:
each save is one row, written by the run's move (runs.store.run_ensure_status, `memory`)."""

from __future__ import annotations

import uuid
from typing import Any

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.agent")

Message = dict[str, Any]


def messages_load(conn: Conn, *, tenant_id: uuid.UUID, conversation_id: str) -> list[Message]:
    rows = conn.execute(
        Q["messages_for_conversation"],
        {"tenant_id": tenant_id, "conversation_id": conversation_id},
    ).fetchall()
    return [message for row in rows for message in row["messages"]]


def messages_delete_for_runs(conn: Conn, run_ids: list[uuid.UUID]) -> int:
    """Retention: drop the messages these runs wrote (rows of either table)."""
    row = conn.execute(Q["messages_delete_for_runs"], {"run_ids": run_ids}).fetchone()
    return int(row["deleted"]) if row else 0
