"""Trace continuity across executions of one run.

Every execution of a run (the first, and each resume after a crash or deploy) is its own
`invoke_agent` span. Each records its span context on the run and links to the earlier ones,
so a backend shows one run as linked traces rather than unrelated ones. With tracing off
there is no span context and this costs nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from opentelemetry.trace import Span, SpanContext
from psycopg.types.json import Jsonb

from app.db.connect import Conn
from app.db.sql import load_queries
from app.telemetry import span_context_from_dict, span_context_to_dict

Q = load_queries("app.agent")

#: Enough to follow a run's history; a run resumed hundreds of times does not need more.
MAX_LINKS = 16


def _contexts(links: list[dict[str, Any]]) -> list[SpanContext]:
    contexts = []
    for link in links[-MAX_LINKS:]:
        try:
            context = span_context_from_dict(link)
        except ValueError:
            continue
        if context.is_valid:
            contexts.append(context)
    return contexts


def swap_execution(conn: Conn, run_id: uuid.UUID, context: SpanContext) -> list[SpanContext]:
    """Record this execution's span context; return the earlier executions' ones."""
    link = span_context_to_dict(context)
    if not link:
        return []
    row = conn.execute(Q["run_trace_link_swap"], {"run_id": run_id, "link": Jsonb([link])})
    found = row.fetchone()
    return _contexts(found["links"]) if found else []


def link_earlier_executions(conn: Conn, run_id: uuid.UUID, span: Span) -> None:
    if not span.get_span_context().is_valid:
        return
    for context in swap_execution(conn, run_id, span.get_span_context()):
        span.add_link(context)
