"""POST /v1/runs/{id}/messages: say something to a running agent.

Durable when it answers 202: the message's row and the wake-up of the run commit together
(runs.messages). The agent reads it at its next turn boundary (the built-in loop) or in
`wait_for_message` (a custom orchestration)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, ClassVar

from fastapi import APIRouter, Header, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ledgerloop.errors import LedgerloopError
from ledgerloop.http.auth import Connection
from ledgerloop.http.errors import responses, storable_text
from ledgerloop.http.routes_runs import Runner
from ledgerloop.runs.messages import MAX_MESSAGE_CHARS, RunMessage, run_message_send

router = APIRouter(prefix="/v1/runs", tags=["runs"])


class MissingIdempotencyKey(LedgerloopError):
    """A message needs an Idempotency-Key header."""

    status_code: ClassVar[int] = 400


class SendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(
        min_length=1,
        description=f"What to tell the agent: text, at most {MAX_MESSAGE_CHARS} characters",
    )

    @field_validator("content")
    @classmethod
    def _text(cls, value: str) -> str:
        return storable_text(value)


class MessageOut(BaseModel):
    id: uuid.UUID
    run_id: uuid.UUID
    idempotency_key: str
    content: str
    sent_by: str
    created_at: datetime
    consumed_at: datetime | None = Field(
        description="When the agent took it into its conversation (null: not yet)"
    )

    @classmethod
    def of(cls, message: RunMessage) -> MessageOut:
        return cls.model_validate(message, from_attributes=True)


@router.post(
    "/{run_id}/messages",
    status_code=202,
    response_model=MessageOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422),
    summary="Send a running agent a message (read at its next turn boundary)",
)
def send(
    run_id: uuid.UUID,
    body: SendMessage,
    response: Response,
    principal: Runner,
    conn: Connection,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="Required: the same key and content is the same message",
        ),
    ] = None,
) -> MessageOut:
    if idempotency_key is None:
        raise MissingIdempotencyKey(
            "POST /v1/runs/{run_id}/messages needs an Idempotency-Key header",
            fix="send a key unique to this message (a UUID); repeat it to retry safely",
        )
    # As the owner (the wake-up is DBOS's send, in schema dbos); the store refuses another
    # tenant's run as not found.
    sent = run_message_send(
        conn,
        run_id=run_id,
        tenant_id=principal.tenant_id,
        idempotency_key=idempotency_key,
        content=body.content,
        sent_by=principal.name,
    )
    response.status_code = 202
    return MessageOut.of(sent.message)
