"""A run's durable record as stream events: pages of agent_run_event after a sequence.

The stream's ids are the events' own sequences: each status move of a run bumps its version
and records its event under that version in the same statement, so they are strictly
increasing and gap-free per run, and a reconnecting client names the last one it saw.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.runs.states import TERMINAL, RunStatus

Q = load_queries("ledgerloop.streams")

#: Events read per page: a replay of a long run is several bounded reads, not one.
PAGE = 500

#: The last event of every stream: the run's final status (not durable: it has no id).
FINISHED = "run.finished"
#: Text as the model writes it (not durable; tagged with the step and its attempt).
TEXT_DELTA = "text.delta"
#: A step execution's body started (not durable; its step and attempt).
STEP_STARTED = "step.started"


@dataclass(frozen=True)
class StreamEvent:
    type: str
    data: dict[str, Any]
    #: The per-run sequence of a durable event; None for one that is not recorded.
    id: int | None = None

    def sse(self) -> bytes:
        """The event in Server-Sent Events framing."""
        lines = [] if self.id is None else [f"id: {self.id}"]
        lines += [f"event: {self.type}", f"data: {json.dumps(self.data, default=str)}"]
        return ("\n".join(lines) + "\n\n").encode()


@dataclass(frozen=True)
class Page:
    status: RunStatus
    version: int
    events: list[StreamEvent] = field(default_factory=list)
    #: True when the page holds the run's whole remaining record (a shorter page).
    complete: bool = True

    @property
    def finished(self) -> bool:
        """The run is terminal and this page reaches the end of its record."""
        return self.status in TERMINAL and self.complete


def durable_event(run_id: uuid.UUID, row: dict[str, Any]) -> StreamEvent:
    at: datetime = row["created_at"]
    return StreamEvent(
        type=row["event_type"],
        id=row["sequence"],
        data={
            "run_id": str(run_id),
            "sequence": row["sequence"],
            "step": row["step"],
            "payload": row["payload"],
            "at": at.isoformat(),
        },
    )


#: The live events a worker publishes (run_text.kind) and their stream type.
LIVE_TYPES = {
    "text": TEXT_DELTA,
    "tool.called": "tool.called",
    "tool.result": "tool.result",
}


def text_event(run_id: uuid.UUID, row: dict[str, Any]) -> StreamEvent:
    """A live event (not durable: no id, so resuming is unaffected): a batch of a model
    call's text, a read tool's call or result. Each names its
    step and attempt: a step cut off and run again publishes under the next attempt."""
    data: dict[str, Any] = {
        "run_id": str(run_id),
        "step": row["step"],
        "attempt": row["attempt"],
        "seq": row["seq"],
    }
    if row["kind"] == "text":
        data["text"] = row["text"]
    else:
        data.update(row["data"] or {})
    return StreamEvent(type=LIVE_TYPES.get(row["kind"], row["kind"]), data=data)


def started_event(first: dict[str, Any]) -> StreamEvent:
    """A step execution's start, told by the first live event it published."""
    keys = ("run_id", "step", "attempt")
    return StreamEvent(type=STEP_STARTED, data={k: first[k] for k in keys})


def read_text(
    conn: Conn, run_id: uuid.UUID, after: int | None, limit: int = PAGE
) -> list[tuple[int, StreamEvent]]:
    """The run's text deltas after the row `after` (one statement); with None, the text of
    its latest streamed call so far. Each with its row id (the feed's cursor)."""
    if after is None:
        rows = conn.execute(Q["text_current"], {"run_id": run_id, "limit": limit})
    else:
        rows = conn.execute(Q["text_since"], {"run_id": run_id, "after": after, "limit": limit})
    return [(row["id"], text_event(run_id, row)) for row in rows.fetchall()]


def finished_event(run_id: uuid.UUID, status: RunStatus, version: int) -> StreamEvent:
    return StreamEvent(
        type=FINISHED, data={"run_id": str(run_id), "status": status.value, "last": version}
    )


def read_page(conn: Conn, run_id: uuid.UUID, after: int, limit: int = PAGE) -> Page | None:
    """The run's events after `after` (one statement), or None when the run is not there for
    this connection (unknown, or another tenant's inside a tenant scope)."""
    rows = conn.execute(Q["stream_page"], {"run_id": run_id, "after": after, "limit": limit})
    found = rows.fetchall()
    if not found:
        return None
    events = [durable_event(run_id, row) for row in found if row["sequence"] is not None]
    return Page(
        status=RunStatus(found[0]["status"]),
        version=found[0]["version"],
        events=events,
        complete=len(events) < limit,
    )
