"""A custom orchestration of two agents, written with the durable primitives, end to end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run, wait_terminal

SCRIPT = """
conversations:
  - match: "Review this answer"
    turns:
      - text: "APPROVED: it cites the disk-full runbook"
default:
  turns:
    - tool_use: {name: search_kb, input: {query: "disk full"}}
    - text: "Check pg_wal and old base backups (runbook disk-full)."
"""


@pytest.fixture
def worker(make_settings: Callable[..., Any], db_url: str) -> Iterator[Callable[[str], Any]]:
    started: list[WorkerThread] = []

    def start(model_url: str) -> WorkerThread:
        settings = make_settings(
            anthropic_base_url=model_url, agent_modules="ledgerloop.examples.review_flow"
        )
        thread = WorkerThread(settings, db_url).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()


def test_researcher_and_reviewer_run_as_named_steps_of_one_run(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(SCRIPT)
    worker(model.url)
    run_id = start_test_run(conn, "researcher", "db-1 disk is full")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert run.state["answer"].startswith("Check pg_wal")
    assert run.state["review"].startswith("APPROVED")
    assert run.state["approved"] is True

    # The reviewer saw the researcher's draft, and only it (its own conversation).
    review = [r for r in model.requests() if "Review this answer" in str(r["request"])]
    assert len(review) == 1
    assert review[0]["request"]["messages"][0]["content"].endswith(run.state["answer"])
    assert review[0]["request"]["tools"] == []

    rows = conn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "ORDER BY function_id",
        (str(run_id),),
    ).fetchall()
    names = [r["function_name"] for r in rows]
    assert names[0] == "memory-load"
    assert names[1] == "think-0"
    assert names[2].startswith("tool-0-")
    assert names[3:] == ["memory-save-0", "think-1", "review.think-0", "memory-save-1"]
    # The conversation memory holds the researcher's messages, not the reviewer's.
    roles = conn.execute(
        "SELECT role FROM ledgerloop.conversation_message WHERE run_id = %s ORDER BY sequence",
        (run_id,),
    ).fetchall()
    assert [r["role"] for r in roles] == ["user", "assistant", "user", "assistant"]
