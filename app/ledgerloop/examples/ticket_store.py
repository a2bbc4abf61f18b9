"""In-memory state of the ticket service: tickets, idempotency records, faults and counters."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ledgerloop.examples.ticket_faults import (
    KINDS,
    ArmedFault,
    FaultHit,
    FaultSpec,
    Kind,
    take_fault,
)

KEY_REUSE_DETAIL = "Idempotency-Key reused with a different request"


class TicketIn(BaseModel):
    """Body of every create endpoint."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200)
    body: str = ""
    priority: Literal["low", "normal", "high"] = "normal"

    def request_hash(self) -> str:
        """Digest of the canonical body, to tell a replay from a reuse of the key."""
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class Ticket(BaseModel):
    """A created ticket as the service returns it."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: Kind
    title: str
    body: str
    priority: Literal["low", "normal", "high"]
    idempotency_key: str | None
    created_at: datetime


class KeyReuseError(Exception):
    """Idempotency-Key reused with a different request."""


class TicketStore:
    """Tickets, idempotency records, armed faults and counters, all behind one lock.

    A threading lock (not an asyncio one) because benchmarks and tests may share one process
    with the service thread, and no critical section awaits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._tickets: dict[str, Ticket] = {}
        self._idempotent: dict[str, tuple[str, str]] = {}  # key -> (request hash, ticket id)
        self._lookup: dict[str, list[str]] = {}  # key -> ids of every ticket sent with it
        self._faults: list[ArmedFault] = []
        self._created: dict[Kind, int] = dict.fromkeys(KINDS, 0)
        self._requests = 0
        self._closed: set[str] = set()
        #: The W3C traceparent of each create request (None when it had none), in order.
        self._traceparents: list[str | None] = []

    def reset(self) -> None:
        with self._lock:
            self._seq = 0
            self._tickets.clear()
            self._idempotent.clear()
            self._lookup.clear()
            self._faults.clear()
            self._created = dict.fromkeys(KINDS, 0)
            self._requests = 0
            self._closed.clear()
            self._traceparents.clear()

    def close(self, ticket_id: str) -> bool | None:
        """Close a ticket: True the first time, False when already closed, None if unknown.

        Closing is naturally idempotent (a second close changes nothing), which makes it a
        safe compensating action to resend.
        """
        with self._lock:
            if ticket_id not in self._tickets:
                return None
            if ticket_id in self._closed:
                return False
            self._closed.add(ticket_id)
            return True

    def begin_request(self, kind: Kind) -> FaultHit | None:
        """Count one create request and consume the first fault that matches it."""
        with self._lock:
            self._requests += 1
            return take_fault(self._faults, kind)

    def create(self, kind: Kind, ticket_in: TicketIn, key: str | None) -> tuple[Ticket, bool]:
        """Create a ticket, or for a repeated idempotent request return the original.

        Returns `(ticket, replayed)`. Check and insert share the lock, so two concurrent
        requests with one key cannot both create.
        """
        request_hash = ticket_in.request_hash()
        with self._lock:
            if kind == "idempotent" and key is not None and key in self._idempotent:
                stored_hash, ticket_id = self._idempotent[key]
                if stored_hash != request_hash:
                    raise KeyReuseError(KEY_REUSE_DETAIL)
                return self._tickets[ticket_id], True
            self._seq += 1
            ticket = Ticket(
                id=f"TCK-{self._seq:06d}",
                kind=kind,
                title=ticket_in.title,
                body=ticket_in.body,
                priority=ticket_in.priority,
                idempotency_key=key,
                created_at=datetime.now(UTC),
            )
            self._tickets[ticket.id] = ticket
            self._created[kind] += 1
            if key is not None and kind == "idempotent":
                self._idempotent[key] = (request_hash, ticket.id)
            elif key is not None and kind == "lookup":
                self._lookup.setdefault(key, []).append(ticket.id)
            return ticket, False

    def get(self, ticket_id: str) -> Ticket | None:
        with self._lock:
            return self._tickets.get(ticket_id)

    def all(self) -> list[Ticket]:
        with self._lock:
            return list(self._tickets.values())

    def idempotent_by_key(self, key: str) -> Ticket | None:
        with self._lock:
            record = self._idempotent.get(key)
            return self._tickets[record[1]] if record else None

    def lookup_by_key(self, key: str) -> list[Ticket]:
        with self._lock:
            return [self._tickets[i] for i in self._lookup.get(key, [])]

    def add_fault(self, spec: FaultSpec) -> list[dict[str, object]]:
        with self._lock:
            self._faults.append(ArmedFault.from_spec(spec))
            return [f.as_json() for f in self._faults]

    def faults(self) -> list[dict[str, object]]:
        with self._lock:
            return [f.as_json() for f in self._faults]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def stats(self) -> dict[str, object]:
        """`requests` counts create requests that passed validation, refused ones included."""
        with self._lock:
            return {
                "created": sum(self._created.values()),
                "by_kind": dict(self._created),
                "requests": self._requests,
                "closed": len(self._closed),
            }

    def traceparents(self) -> list[str | None]:
        with self._lock:
            return list(self._traceparents)

    def note_traceparent(self, value: str | None) -> None:
        """Keep a create request's trace context, so a demo or test can follow the trace."""
        with self._lock:
            self._traceparents.append(value)
