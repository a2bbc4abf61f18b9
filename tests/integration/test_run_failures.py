"""Failures nobody planned for end the run: failed / internal_error, compensated, the model
told nothing; a bug is not retried."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events
from tests.conftest import start_test_run, wait_terminal
from tests.support.agents import BROKEN_CALLS

WRITE_THEN_BUG = """
default:
  turns:
    - tool_use: {name: ticket_undoable, input: {title: "to be undone"}}
    - tool_use: {name: broken_lookup, input: {key: "kf-1"}}
    - text: "never reached"
"""


def test_a_tool_raising_key_error_fails_the_run_and_compensates_its_write(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    BROKEN_CALLS.clear()
    model = scripted_model(WRITE_THEN_BUG)
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file, then look something up")
    run = wait_terminal(conn, run_id)

    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "internal_error"
    assert run.state["error"] == {"type": "KeyError", "message": "'kf-1'"}
    last = run_events(conn, run_id)[-1]
    assert last.event_type == "internal_error"
    assert last.payload["error"]["type"] == "KeyError"
    # A bug is not retried: the handler ran once.
    assert BROKEN_CALLS == {"kf-1": 1}
    # The ticket filed before the bug was closed by a compensating effect.
    stats = httpx.get(f"{tickets.url}/_stats").json()
    assert (stats["created"], stats["closed"]) == (1, 1)
    effects = {e.key: e for e in effect_list(conn, run_id=run_id)}
    (original,) = [e for e in effects.values() if e.compensates is None]
    assert effects[original.key + ":compensate"].status.value == "succeeded"
    assert run.state["compensations"] == [
        {"key": original.key + ":compensate", "status": "succeeded"}
    ]
    # The model was asked twice and never heard of the error.
    requests = model.requests()
    assert [r["turn"] for r in requests] == [0, 1]
    assert "KeyError" not in json.dumps(requests)
