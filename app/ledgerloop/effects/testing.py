"""Helpers for tests of code that writes effects (ours, and a user's own).

- `workflow_row`: the DBOS workflow row a run's messages go to, without running DBOS.
- `act_event`: the event an act step records with its effect, so the relay will send it.
- `messages_for`: the effect messages sent to a run, as the workflow would receive them.
- `drain_outbox`: deliver everything pending now, synchronously.
- `RelayThread`: the relay service on a background thread, with its test signals.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from ledgerloop.db.connect import Conn
from ledgerloop.effects.relay import Relay, RelayConfig


def workflow_row(conn: Conn, run_id: uuid.UUID) -> None:
    """Create the (enqueued, never executed) DBOS workflow whose id is the run id."""
    conn.execute(
        "SELECT dbos.enqueue_workflow('ledgerloop_run', 'ledgerloop_runs', "
        "ARRAY[to_json(%(id)s::text)], workflow_id => %(id)s)",
        {"id": str(run_id)},
    )


def act_event(conn: Conn, run_id: uuid.UUID, key: str, *, call_id: str = "call-1") -> None:
    """Record the run's event that an act step commits with its effect (`executing`, naming
    the key): the relay sends only effects a run vouches for so (effects/queries.sql,
    outbox_claim). For tests that write effects without running the act step."""
    conn.execute(
        "INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, "
        "payload, step) "
        "SELECT r.id, r.tenant_id, coalesce(max(e.sequence), 0) + 1, 'executing', "
        "jsonb_build_object('tool_call_id', %(call)s::text, 'idempotency_key', %(key)s::text), "
        "'tool-test-' || %(call)s "
        "FROM ledgerloop.agent_run r LEFT JOIN ledgerloop.agent_run_event e ON e.run_id = r.id "
        "WHERE r.id = %(run)s GROUP BY r.id, r.tenant_id",
        {"run": run_id, "key": key, "call": call_id},
    )


def messages_for(conn: Conn, run_id: uuid.UUID, topic: str | None = None) -> list[dict[str, Any]]:
    """Messages to the run's workflow, oldest first, decoded the way DBOS's recv decodes them.

    Each item: `message_id`, `topic`, `message` (the decoded value) and `serialization`.
    """
    from dbos import DBOSPortableJSONSerializer

    # Every message to a run is portable JSON (the SQL send and the workers' serializer);
    # anything else is refused rather than decoded, so nothing here is ever unpickled.
    portable = DBOSPortableJSONSerializer()
    rows = conn.execute(
        "SELECT message_uuid, topic, message, serialization FROM dbos.notifications "
        "WHERE destination_uuid = %(id)s AND (%(topic)s::text IS NULL OR topic = %(topic)s) "
        "ORDER BY created_at_epoch_ms, message_uuid",
        {"id": str(run_id), "topic": topic},
    ).fetchall()
    return [
        {
            "message_id": row["message_uuid"],
            "topic": row["topic"],
            "message": portable.deserialize(_portable(row, portable.name())),
            "serialization": row["serialization"],
        }
        for row in rows
    ]


def drain_outbox(
    url: str, destinations: Mapping[str, str], config: RelayConfig | None = None
) -> int:
    """Deliver every pending outbox row (retries included); returns outcomes recorded."""

    async def go() -> int:
        async with Relay(url, destinations, config) as relay:
            return await relay.drain()

    return asyncio.run(go())


class RelayThread:
    """`Relay.run` on its own event loop in a background thread."""

    def __init__(
        self, url: str, destinations: Mapping[str, str], config: RelayConfig | None = None
    ) -> None:
        self.relay = Relay(url, destinations, config)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._main, name="relay", daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        async def go() -> None:
            async with self.relay:
                await self.relay.run(self._stop)

        try:
            self._loop.run_until_complete(go())
        except BaseException as exc:
            self.error = exc
        finally:
            self._loop.close()

    def ready(self) -> bool:
        """Listening and idle: a row inserted now is delivered only by a notification."""
        return self.relay.listening.is_set() and self.relay.idle.is_set()

    def start(self) -> RelayThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"relay thread did not stop within {timeout}s")
        if self.error is not None:
            raise self.error

    def __enter__(self) -> RelayThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _portable(row: Mapping[str, Any], name: str) -> str | None:
    if row["serialization"] != name:
        raise ValueError(
            f"message {row['message_uuid']} is {row['serialization']}, not {name}; "
            "Ledgerloop reads portable JSON only"
        )
    message: str | None = row["message"]
    return message
