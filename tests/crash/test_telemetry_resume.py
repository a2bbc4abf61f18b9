"""A run killed mid-way and resumed: the new execution's trace holds only the work it really
did (no chat or execute_tool span for a step answered from the journal) and links to the
execution that died. Exported over OTLP/HTTP from real worker processes to a real receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.processes import worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal
from tests.support.otlp import Receiver, running_receiver

pytestmark = pytest.mark.crash


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def test_resumed_run_emits_no_duplicate_spans_and_links_back(
    conn: Conn, db_url: str, scripted_model: Any, receiver: Receiver, tmp_path: Path
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: echo, input: {text: once}}
            - text: finished
        """
    )
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    with worker_process({**env, "LEDGERLOOP_FAULTS": "loop.after_tools"}) as first:
        run_id = start_test_run(conn, "looper", "echo please")
        assert first.wait(timeout=60) == -9
    with worker_process(env):
        assert wait_terminal(conn, run_id, timeout=60).status is RunStatus.SUCCEEDED
    # Leaving the block stops the worker with SIGTERM, which flushes its exporters.

    spans = receiver.spans()
    resumed = [s for s in spans if s.name == "invoke_agent looper" and len(s.links) > 0]
    assert len(resumed) == 1, [s.name for s in spans]
    trace = resumed[0].trace_id
    in_resumed = [s.name for s in spans if s.trace_id == trace]
    # think-0 and the echo tool ran before the kill; the resumed execution replayed them.
    assert sorted(in_resumed) == ["chat claude-haiku-4-5", "invoke_agent looper"]
    # The link points at the execution that died, as recorded in the run's journal.
    journal = conn.execute(
        "SELECT output FROM dbos.operation_outputs WHERE workflow_uuid = %s AND function_id = 1",
        (str(run_id),),
    ).fetchone()
    assert journal is not None
    first = json.loads(journal["output"])["trace"]
    assert resumed[0].links[0].span_id.hex() == first["span_id"]
    assert resumed[0].links[0].trace_id.hex() == first["trace_id"]
    assert resumed[0].trace_id.hex() != first["trace_id"]
