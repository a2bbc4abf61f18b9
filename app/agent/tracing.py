"""Trace continuity across executions of one run.

Every execution of a run (the first, and each resume after a crash or deploy) is its own
`invoke_agent` span. Each records its span context on the run, and a later execution links to
the earlier ones, so a backend shows one run as linked traces rather than unrelated ones.
"""

from __future__ import annotations

import uuid
from typing import Any

from opentelemetry.trace import SpanContext
from psycopg.types.json import Jsonb

from app.db.connect import Conn
from app.db.sql import load_queries
from app.telemetry import span_context_from_dict, span_context_to_dict

Q = load_queries("app.agent")

#: Enough to follow a run's history; a run resumed hundreds of times does not need more.
MAX_LINKS = 16


def earlier_executions(conn: Conn, run_id: uuid.UUID) -> list[SpanContext]:
    row = conn.execute(Q["run_trace_links"], {"run_id": run_id}).fetchone()
    links: list[dict[str, Any]] = row["links"] if row else []
    contexts = []
    for link in links[-MAX_LINKS:]:
        try:
            contexts.append(span_context_from_dict(link))
        except ValueError:
            continue
    return [c for c in contexts if c.is_valid]


def record_execution(conn: Conn, run_id: uuid.UUID, context: SpanContext) -> None:
    link = span_context_to_dict(context)
    if link:
        conn.execute(Q["run_trace_link_add"], {"run_id": run_id, "link": Jsonb([link])})
