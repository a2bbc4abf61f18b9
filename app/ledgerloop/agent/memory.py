"""Conversation memory: loaded once per run (memory-load), appended per turn (memory-save-{i})."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.agent")

Message = dict[str, Any]


def messages_load(conn: Conn, *, tenant_id: uuid.UUID, conversation_id: str) -> list[Message]:
    rows = conn.execute(
        Q["messages_for_conversation"],
        {"tenant_id": tenant_id, "conversation_id": conversation_id},
    ).fetchall()
    return [{"role": row["role"], "content": row["content"]} for row in rows]


def messages_append(
    conn: Conn,
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    conversation_id: str,
    turn: int,
    first_sequence: int,
    messages: list[Message],
) -> None:
    """Append `messages` at `first_sequence`..; re-appending the same sequence is a no-op."""
    with conn.cursor() as cur:
        cur.executemany(
            Q["message_insert"],
            [
                {
                    "run_id": run_id,
                    "tenant_id": tenant_id,
                    "conversation_id": conversation_id,
                    "sequence": first_sequence + offset,
                    "turn": turn,
                    "role": message["role"],
                    "content": Jsonb(message["content"]),
                }
                for offset, message in enumerate(messages)
            ],
        )
