"""Messages to a running agent: the store behind POST /v1/runs/{id}/messages and the steps that
take them into the run's conversation.

A message is durable once `run_message_send` returns: its row and the DBOS message that wakes
the run (a hibernated run, or a custom orchestration in `wait_for_message`) commit in one
transaction. One row per (run, Idempotency-Key): the same key with the same content is the
same message; with other content it is refused.

The run takes a message with a step (agent.messages): the step's journaled result holds it,
so a replay adds it to the conversation at the same place. The row is marked consumed by the
run's next take, once that result is journaled; until then a retried step reads it again.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import psycopg.errors
from psycopg.types.json import Jsonb

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import RunNotFound

Q = load_queries("ledgerloop.runs", "messages.sql")

#: The DBOS topic every message to a run is announced on (its payload: the message's id).
MESSAGE_TOPIC = "ledgerloop:message"
#: The most characters a message may hold (the request body's own limit is 256 KiB).
MAX_MESSAGE_CHARS = 32_000
#: The most messages one take adds to the conversation (the rest wait for the next one).
TAKE_LIMIT = 50


class MessageKeyReused(LedgerloopError):
    """This Idempotency-Key already sent the run a different message."""

    status_code: ClassVar[int] = 422


class RunNotListening(LedgerloopError):
    """The run has ended: nothing would ever read the message."""

    status_code: ClassVar[int] = 409


class MessageTooLarge(LedgerloopError):
    """The message is over the input limit."""

    status_code: ClassVar[int] = 413


class MessageUndeliverable(LedgerloopError):
    """The run has no workflow to deliver the message to."""

    status_code: ClassVar[int] = 409


@dataclass(frozen=True)
class RunMessage:
    id: uuid.UUID
    run_id: uuid.UUID
    idempotency_key: str
    content: str
    sent_by: str
    created_at: datetime
    consumed_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunMessage:
        return cls(**{**row, "content": row["content"]["text"]})


@dataclass(frozen=True)
class Sent:
    message: RunMessage
    #: False: this key had sent the same message before (nothing new was written).
    created: bool


def message_problem(content: str) -> str | None:
    if len(content) > MAX_MESSAGE_CHARS:
        return f"the message has {len(content)} characters, more than {MAX_MESSAGE_CHARS}"
    return None


def run_message_send(
    conn: Conn,
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    idempotency_key: str,
    content: str,
    sent_by: str,
) -> Sent:
    """Record `content` for the run and wake it, in one transaction (its own, or the caller's).

    Another tenant's run is not found; a run that ended refuses a new message (a repeat of
    one it already has is still answered with it)."""
    problem = message_problem(content)
    if problem is not None:
        raise MessageTooLarge(problem, fix="send a shorter message, or the id of a document")
    with conn.transaction():
        run = conn.execute(Q["run_message_run_lock"], {"run_id": run_id}).fetchone()
        if run is None or run["tenant_id"] != tenant_id:
            raise RunNotFound(
                f"no run {run_id}", fix="check the run id (runs of other tenants are not shown)"
            )
        key = {"run_id": run_id, "idempotency_key": idempotency_key}
        existing = conn.execute(Q["run_message_by_key"], key).fetchone()
        if existing is not None:
            return Sent(_same(RunMessage.from_row(existing), content), created=False)
        status = RunStatus(run["status"])
        if status in TERMINAL:
            raise RunNotListening(
                f"run {run_id} is {status.value}; nobody will read the message",
                fix="start a new run (with the same conversation_id to keep its memory)",
            )
        row = conn.execute(
            Q["run_message_insert"],
            {
                **key,
                "id": uuid.uuid4(),
                "tenant_id": tenant_id,
                "content": Jsonb({"text": content}),
                "sent_by": sent_by,
            },
        ).fetchone()
        if row is None:  # the same key committed concurrently; our lock order serialized us
            again = conn.execute(Q["run_message_by_key"], key).fetchone()
            assert again is not None
            return Sent(_same(RunMessage.from_row(again), content), created=False)
        message = RunMessage.from_row(row)
        try:
            conn.execute(
                Q["run_message_send"],
                {
                    "destination_id": str(run_id),
                    "message": json.dumps({"message_id": str(message.id)}),
                    "topic": MESSAGE_TOPIC,
                    "message_id": f"message:{message.id}",
                },
            )
        except psycopg.errors.ForeignKeyViolation as exc:
            raise MessageUndeliverable(
                f"run {run_id} has no workflow to receive the message; nothing was recorded",
                fix="start runs with ledgerloop.start_run or the API so that each has a workflow",
            ) from exc
        return Sent(message, created=True)


def _same(message: RunMessage, content: str) -> RunMessage:
    if message.content != content:
        raise MessageKeyReused(
            f"Idempotency-Key {message.idempotency_key!r} already sent message {message.id} "
            "to this run, with different content",
            fix="send the original message again, or use a new key for a new message",
        )
    return message


def run_message_take(
    conn: Conn, run_id: str, taken: list[str], limit: int = TAKE_LIMIT
) -> list[dict[str, Any]]:
    """The run's pending messages (step body: its result is journaled), oldest first, as
    {"id", "text", "sent_by"}; the ones in `taken` are marked consumed on the way."""
    with conn.transaction():
        rows = conn.execute(
            Q["run_message_take"], {"run_id": run_id, "taken": taken, "limit": limit}
        ).fetchall()
    return [
        {"id": str(row["id"]), "text": row["content"]["text"], "sent_by": row["sent_by"]}
        for row in rows
    ]


def run_message_pending(conn: Conn, run_id: str, taken: list[str]) -> bool:
    row = conn.execute(Q["run_message_pending"], {"run_id": run_id, "taken": taken}).fetchone()
    return bool(row and row["pending"])
