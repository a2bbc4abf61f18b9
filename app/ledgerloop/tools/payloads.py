"""Large tool outputs go to ledgerloop.payload; the journal keeps a reference and a preview.

DBOS checkpoints every step output into its tables, so a 10 MB tool result would be copied
into the journal and re-read on every replay. Past the threshold we store it once and the
model sees a truncated view that names the reference.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.agent")

PREVIEW_CHARS = 2_000


@dataclass(frozen=True)
class Offloaded:
    visible: str
    payload_id: str | None
    size_bytes: int


def payload_id_for(run_id: uuid.UUID, tool_call_id: str) -> uuid.UUID:
    # Deterministic: a step that re-runs after a crash stores the same payload, not a second.
    return uuid.uuid5(run_id, f"payload:{tool_call_id}")


def offload_if_large(
    conn: Conn,
    text: str,
    *,
    limit_bytes: int,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    tool_call_id: str,
    kind: str = "tool_result",
) -> Offloaded:
    data = text.encode()
    if len(data) <= limit_bytes:
        return Offloaded(text, None, len(data))
    pid = payload_id_for(run_id, tool_call_id)
    conn.execute(
        Q["payload_insert"],
        {
            "id": pid,
            "tenant_id": tenant_id,
            "run_id": run_id,
            "kind": kind,
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "content": text,
        },
    )
    visible = (
        text[:PREVIEW_CHARS]
        + f"\n[truncated: the full output ({len(data)} bytes) is stored as payload {pid}]"
    )
    return Offloaded(visible, str(pid), len(data))


def payload_get(conn: Conn, payload_id: uuid.UUID) -> dict[str, Any] | None:
    return conn.execute(Q["payload_get"], {"id": payload_id}).fetchone()


def payloads_delete_for_runs(conn: Conn, run_ids: list[uuid.UUID]) -> int:
    """Retention: drop the offloaded tool outputs of these runs."""
    return conn.execute(Q["payloads_delete_for_runs"], {"run_ids": run_ids}).rowcount
