"""The durable loop end to end: real Postgres, real DBOS, the real SDK and the scripted model."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events
from ledgerloop.testing.worker import WorkerThread
from ledgerloop.tools.payloads import payload_get
from tests.conftest import journal_steps, start_test_run, wait_terminal
from tests.support import agents as test_agents

WorkerFactory = Callable[..., WorkerThread]


@pytest.fixture
def worker(make_settings: Callable[..., Any], db_url: str) -> Iterator[WorkerFactory]:
    started: list[WorkerThread] = []

    def start(model_url: str, **overrides: Any) -> WorkerThread:
        settings = make_settings(
            anthropic_base_url=model_url, agent_modules="tests.support.agents", **overrides
        )
        thread = WorkerThread(settings, db_url).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()


def _roles(conn: Conn, run_id: Any) -> list[str]:
    rows = conn.execute(
        "SELECT role FROM ledgerloop.conversation_message WHERE run_id = %s ORDER BY sequence",
        (run_id,),
    ).fetchall()
    return [r["role"] for r in rows]


def _tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    last = request["request"]["messages"][-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def test_two_turn_run_with_a_read_tool(conn: Conn, scripted_model: Any, worker: Any) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: search_kb, input: {query: "disk full"}}
            - text: "Check pg_wal and old base backups."
        """
    )
    worker(model.url)
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert run.state["answer"] == "Check pg_wal and old base backups."
    requests = model.requests()
    assert [r["turn"] for r in requests] == [0, 1]
    results = _tool_results(requests[1])
    assert len(results) == 1
    assert "disk-full" in results[0]["content"]
    assert not results[0]["is_error"]
    steps = journal_steps(conn, run_id)
    # A read-tool turn is one step: its tool runs at the start of the next think step and
    # its result is journaled with that model call. Its messages reach memory with the
    # final save, and a read tool leaves the run's status alone. The answer's think step
    # makes that save (recorded under memory-save-1): no step of its own.
    assert steps == ["memory-load", "think-0", "think-1"]
    journaled = conn.execute(
        "SELECT output FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "AND function_name = 'think-1'",
        (str(run_id),),
    ).fetchone()
    assert journaled is not None
    assert json.loads(journaled["output"])["reads"] == results
    events = run_events(conn, run_id)
    assert [e.event_type for e in events] == ["received", "planning", "succeeded"]
    step_of = conn.execute(
        "SELECT step FROM ledgerloop.agent_run_event WHERE run_id = %s AND sequence = %s",
        (run_id, events[-1].sequence),
    ).fetchone()
    assert step_of is not None
    assert step_of["step"] == "memory-save-1"
    assert events[-1].payload == {"answer": run.state["answer"], "turns": 2, "empty_turns": 0}
    # The conversation is in our schema, in order, the model's tool_use blocks included.
    rows = conn.execute(
        "SELECT role, turn FROM ledgerloop.conversation_message WHERE run_id = %s "
        "ORDER BY sequence",
        (run_id,),
    ).fetchall()
    assert [(r["role"], r["turn"]) for r in rows] == [
        ("user", 0),
        ("assistant", 0),
        ("user", 0),
        ("assistant", 1),
    ]


def test_unknown_tool_and_bad_arguments_become_error_results(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use:
                - {name: launch_rockets, input: {}}
                - {name: echo, input: {text: 42}}
                - {name: echo, input: {}}
            - text: "done"
        """
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "go"))
    assert run.status is RunStatus.SUCCEEDED
    results = _tool_results(model.requests()[1])
    assert [r["is_error"] for r in results] == [True, True, True]
    assert "unknown tool 'launch_rockets'" in results[0]["content"]
    assert "echo" in results[0]["content"]  # names the tools it does have
    assert "invalid arguments for echo" in results[1]["content"]
    assert "text" in results[2]["content"]


def test_empty_turn_escalates_to_the_strong_tier_once(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - by_model:
                cheap-model: {empty: true}
                strong-model: {text: "answered by the strong tier"}
        """
    )
    worker(model.url, model_cheap="cheap-model", model_strong="strong-model")
    run_id = start_test_run(conn, "looper", "hello")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert run.state["answer"] == "answered by the strong tier"
    assert run.state["empty_turns"] == 1
    assert [r["model"] for r in model.requests()] == ["cheap-model", "strong-model"]
    assert "think-0-strong" in journal_steps(conn, run_id)


def test_empty_turn_on_the_strong_tier_fails_the_run(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{empty: true}]}")
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "strong_only", "hello"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "empty_turns"
    assert len(model.requests()) == 1  # never re-sent to the same tier


def test_prose_answer_is_not_an_empty_turn(conn: Conn, scripted_model: Any, worker: Any) -> None:
    model = scripted_model("default: {turns: [{text: 'just prose', output_tokens: 0}]}")
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hello"))
    assert run.status is RunStatus.SUCCEEDED
    assert run.state["empty_turns"] == 0


def test_iteration_cap_ends_the_run(conn: Conn, scripted_model: Any, worker: Any) -> None:
    turn = "{tool_use: {name: echo, input: {text: again}}}"
    model = scripted_model(f"default: {{turns: [{', '.join([turn] * 10)}]}}")
    worker(model.url, max_iterations=3)
    run = wait_terminal(conn, start_test_run(conn, "looper", "loop forever"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "iteration_cap"
    assert len(model.requests()) == 3
    # The reads of turns 0 and 1 ran in the next think step; the last turn's, with no think
    # after it, in a step of their own, so the saved conversation ends with their results.
    steps = journal_steps(conn, run.id)
    assert [s.split("-toolu_")[0] for s in steps] == [
        "memory-load",
        "think-0",
        "think-1",
        "think-2",
        "tool-2",
        "finish",
    ]
    assert _roles(conn, run.id)[-2:] == ["assistant", "user"]


def test_deadline_fails_the_run_with_the_reason(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        "default: {turns: [{tool_use: {name: echo, input: {text: a}}, delay_ms: 300}, "
        "{text: never}]}"
    )
    worker(model.url, run_deadline_s=0.2)
    run = wait_terminal(conn, start_test_run(conn, "looper", "slow"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "deadline_exceeded"
    assert len(model.requests()) == 1
    # The turn's read would have run in the next think; with none coming, it runs in a step
    # of its own before the finish, so the saved conversation answers its tool_use.
    steps = journal_steps(conn, run.id)
    assert [s.split("-toolu_")[0] for s in steps] == ["memory-load", "think-0", "tool-0", "finish"]
    assert _roles(conn, run.id) == ["user", "assistant", "user"]


def test_rejected_answers_are_fed_back_and_capped(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        "default: {turns: [{text: 'restart it'}, {text: 'reboot'}, {text: 'clear pg_wal backups'}]}"
    )
    worker(model.url, max_rejected_answers=2)
    run = wait_terminal(conn, start_test_run(conn, "picky", "disk full"))
    assert run.status is RunStatus.SUCCEEDED
    assert run.state["answer"] == "clear pg_wal backups"
    second = model.requests()[1]["request"]["messages"][-1]
    assert "rejected: the answer must name pg_wal" in second["content"]
    # Each rejection is in the history, although the run stayed in planning.
    rejections = [e for e in run_events(conn, run.id) if e.event_type == "answer_rejected"]
    assert [e.payload["reason"] for e in rejections] == ["the answer must name pg_wal"] * 2


def test_read_tools_leave_the_run_status_alone(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use:
                - {name: echo, input: {text: one}}
                - {name: echo, input: {text: two}}
            - text: done
        """
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "two calls"))
    assert run.status is RunStatus.SUCCEEDED
    # Both calls ran (their results reached the model), and neither wrote to the run.
    results = _tool_results(model.requests()[1])
    assert [r["content"] for r in results] == ["echo: one", "echo: two"]
    assert [e.event_type for e in run_events(conn, run.id)] == [
        "received",
        "planning",
        "succeeded",
    ]


def test_rejected_answer_budget_exhausted_fails(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{text: a}, {text: b}, {text: c}, {text: d}]}")
    worker(model.url, max_rejected_answers=2)
    run = wait_terminal(conn, start_test_run(conn, "picky", "disk full"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "rejected_answers"
    assert len(model.requests()) == 3


def test_large_tool_output_is_offloaded(conn: Conn, scripted_model: Any, worker: Any) -> None:
    model = scripted_model(
        "default: {turns: [{tool_use: {name: big_output, input: {kib: 200}}}, {text: done}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "looper", "fetch it")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    payload = conn.execute(
        "SELECT id, size_bytes FROM ledgerloop.payload WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert payload is not None
    assert payload["size_bytes"] == 200 * 1024
    stored = payload_get(conn, payload["id"])
    assert stored is not None
    assert stored["content"] == "x" * (200 * 1024)
    seen = _tool_results(model.requests()[1])[0]["content"]
    assert str(payload["id"]) in seen
    assert len(seen) < 4096
    # The journal holds the reference, not the 200 KiB.
    journal = conn.execute(
        "SELECT max(length(output)) AS n FROM dbos.operation_outputs WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert journal is not None
    assert journal["n"] < 64 * 1024


def test_retryable_tool_errors_retry_inside_the_step(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use:
                - {name: flaky, input: {key: recovers, fail_times: 2}}
                - {name: flaky, input: {key: gives-up, fail_times: 9}}
                - {name: denied, input: {key: denied-once}}
            - text: done
        """
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "try"))
    assert run.status is RunStatus.SUCCEEDED
    ok, exhausted, denied = _tool_results(model.requests()[1])
    assert not ok["is_error"]
    assert "ok after 3 attempts" in ok["content"]
    assert exhausted["is_error"]
    failure = json.loads(exhausted["content"])
    assert failure["type"] == "RetryBudgetExhausted"
    assert failure["attempts"] == 3  # default policy: max_retries=2
    assert denied["is_error"]
    assert "PolicyDenied" in denied["content"]
    # Non-retryable errors do not burn retries.
    assert test_agents.FLAKY_CALLS["denied-once"] == 1
    assert test_agents.FLAKY_CALLS["gives-up"] == 3


def test_model_failure_is_one_attempt_and_fails_the_run(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{status: 500}]}")
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hi"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "model_call_failed"
    assert run.state["model_error"]["status_code"] == 500
    assert len(model.requests()) == 1


def test_a_second_run_in_a_conversation_loads_its_memory(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        """
        default: {turns: [{text: "first answer"}]}
        conversations:
          - match: "follow-up"
            turns: [{text: "second answer"}]
        """
    )
    worker(model.url)
    first = start_test_run(conn, "looper", "opening question", conversation_id="c-1")
    assert wait_terminal(conn, first).status is RunStatus.SUCCEEDED
    second = start_test_run(conn, "looper", "follow-up question", conversation_id="c-1")
    assert wait_terminal(conn, second).status is RunStatus.SUCCEEDED
    seen = model.requests()[-1]["request"]["messages"]
    assert [m["role"] for m in seen] == ["user", "assistant", "user"]
    assert seen[0]["content"] == "opening question"
    assert seen[1]["content"][0]["text"] == "first answer"


def test_history_saved_a_message_a_row_by_the_previous_release_is_read_with_new_saves(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    """Migration 0017 is additive: rows an older worker wrote in agent_message (a message a
    row) are history too, in order with the one-row-per-save batches of this release."""
    # A request's turn is the number of assistant messages in it, history included.
    model = scripted_model("default: {turns: [{text: x}, {text: second}, {text: third}]}")
    worker(model.url)
    older = uuid.uuid4()
    one = Jsonb([{"type": "text", "text": "one"}])
    conn.execute(
        "INSERT INTO ledgerloop.agent_message "
        "(run_id, tenant_id, conversation_id, sequence, turn, role, content, created_at) "
        "VALUES (%s, %s, 'c-old', 0, 0, 'user', %s, now() - interval '1h'),"
        "       (%s, %s, 'c-old', 1, 0, 'assistant', %s, now() - interval '1h')",
        (older, DEFAULT_TENANT, Jsonb("first question"), older, DEFAULT_TENANT, one),
    )
    first = start_test_run(conn, "looper", "second question", conversation_id="c-old")
    assert wait_terminal(conn, first).status is RunStatus.SUCCEEDED
    second = start_test_run(conn, "looper", "third question", conversation_id="c-old")
    assert wait_terminal(conn, second).status is RunStatus.SUCCEEDED
    seen = model.requests()[-1]["request"]["messages"]
    assert [m["content"] if m["role"] == "user" else m["content"][0]["text"] for m in seen] == [
        "first question",
        "one",
        "second question",
        "second",
        "third question",
    ]
    rows = conn.execute(
        "SELECT run_id, sequence, turn, role FROM ledgerloop.conversation_message "
        "WHERE conversation_id = 'c-old' ORDER BY created_at, run_id, sequence"
    ).fetchall()
    assert [(r["sequence"], r["turn"], r["role"]) for r in rows] == [
        (0, 0, "user"),
        (1, 0, "assistant"),
        (0, 0, "user"),
        (1, 0, "assistant"),
        (0, 0, "user"),
        (1, 0, "assistant"),
    ]


def test_an_agent_turns_its_input_into_the_first_message(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    from ledgerloop.runs.start import start_run

    model = scripted_model("default:\n  turns:\n    - text: 'Disk ticket, high.'\n")
    worker(model.url)
    run_id = start_run(
        conn,
        agent="ticket_reader",
        input={"ticket_id": 7, "priority": "high", "summary": "db-1 disk full"},
    )
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    [request] = model.requests()
    first = request["request"]["messages"][0]
    assert first == {"role": "user", "content": "Ticket 7 (high): db-1 disk full"}
    stored = conn.execute(
        "SELECT content FROM ledgerloop.conversation_message WHERE run_id = %s AND sequence = 0",
        (run_id,),
    ).fetchone()
    assert stored is not None
    assert stored["content"] == "Ticket 7 (high): db-1 disk full"
