"""The live rows a worker publishes (streams/publish.py) on a real database: one write per
step execution, attempts numbered per run and step, read back in order, swept."""

from __future__ import annotations

import functools
import uuid

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, connect
from ledgerloop.runs.start import start_run
from ledgerloop.streams.feed import read_text
from ledgerloop.streams.publish import TextPublisher
from ledgerloop.testing.postgres import wait_until


def _run(conn: Conn) -> uuid.UUID:
    return start_run(conn, agent="ops", input={"message": "text"}, tenant_id=DEFAULT_TENANT)


def test_attempts_order_and_sweep(conn: Conn, db_url: str) -> None:
    publisher = TextPublisher(functools.partial(connect, db_url))
    try:
        run_id = _run(conn)
        first = publisher.open(run_id, "think-0")
        first.mark("tool.called", {"tool": "echo", "tool_call_id": "c1"})
        for word in ("Hello ", "there, ", "friend."):
            first.write(word)
        wait_until(lambda: first.written == first.given, timeout=10)
        again = publisher.open(run_id, "think-0")  # the step runs again
        again.write("Hi.")
        wait_until(lambda: again.written == again.given, timeout=10)
        assert (first.attempt, again.attempt) == (1, 2)

        rows = read_text(conn, run_id, 0)
        ids = [row_id for row_id, _ in rows]
        assert ids == sorted(ids)
        events = [event for _, event in rows]
        assert events[0].type == "tool.called"
        assert events[0].data["tool"] == "echo"
        assert all(event.id is None for event in events)
        first_text = "".join(
            e.data["text"] for e in events if e.data["attempt"] == 1 and "text" in e.data
        )
        assert first_text == "Hello there, friend."
        # A subscriber joining now gets the latest execution's text from its start.
        current = [event for _, event in read_text(conn, run_id, None)]
        assert [(e.data["attempt"], e.data["text"]) for e in current] == [(2, "Hi.")]

        # The sweep keeps a live run's rows and drops a long-finished or purged run's.
        finished, gone = _run(conn), uuid.uuid4()
        for other in (finished,):
            late = publisher.open(other, "think-0")
            late.write("bye")
            wait_until(lambda c=late: c.written == c.given, timeout=10)
        conn.execute(
            "UPDATE ledgerloop.agent_run SET status = 'succeeded', "
            "updated_at = now() - interval '1 hour' WHERE id = %s",
            (finished,),
        )
        conn.execute(
            "INSERT INTO ledgerloop.run_text (run_id, tenant_id, step, attempt, seq, text) "
            "VALUES (%s, %s, 'think-0', 1, 0, 'orphan')",
            (gone, DEFAULT_TENANT),
        )
        publisher._sweep()
        left = {
            row["run_id"] for row in conn.execute("SELECT DISTINCT run_id FROM ledgerloop.run_text")
        }
        assert left == {run_id}
    finally:
        publisher.close()
