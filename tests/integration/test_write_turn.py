"""A turn of plain writes (no approval possible) rides the next think step (agent.turn_tools).

Real Postgres, a real in-process worker with its relay, the ticket service over HTTP and the
real SDK against the scripted model. The journal (dbos.operation_outputs) shows which steps
ran; the run's events, the effects and the ticket service show what happened outside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.effects.testing import messages_for
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.telemetry.runtrace import traceparent
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, start_relay, stop_worker, worker_env
from tests.conftest import journal_steps, start_test_run, wait_terminal
from tests.support.telemetry import Captured


def _stats(tickets: TicketServiceThread) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{tickets.url}/_stats").json()
    return stats


def _metric_sums(captured: Captured) -> dict[str, float]:
    wanted = ("gen_ai.invoke_agent.inference_calls", "gen_ai.invoke_agent.tool_calls")
    return {
        metric.name: sum(point.sum for point in metric.data.data_points)  # type: ignore[union-attr]
        for resource in captured.metrics.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name in wanted
    }


def _tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    last = request["request"]["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


MIXED = """
default:
  turns:
    - tool_use:
        - {name: ticket_idempotent, input: {title: first}}
        - {name: echo, input: {text: between}}
        - {name: ticket_undoable, input: {title: second}}
    - text: done
"""


def test_a_turn_of_writes_and_reads_is_one_step(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(MIXED)
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file two")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    # No tool step, no durable wait: the writes, the read and the answer are think-1's.
    assert journal_steps(conn, run_id) == ["memory-load", "think-0", "think-1"]
    assert _stats(tickets)["created"] == 2
    effects = effect_list(conn, run_id=run_id)
    assert sorted(e.status.value for e in effects) == ["succeeded", "succeeded"]
    # The model heard every call's result, in the order it asked for them.
    requests = model.requests()
    assert [r["turn"] for r in requests] == [0, 1]
    calls = [b["id"] for b in requests[1]["request"]["messages"][-2]["content"]]
    results = _tool_results(requests[1])
    assert [r["tool_use_id"] for r in results] == calls
    assert not any(r["is_error"] for r in results)
    filed = {json.loads(results[n]["content"])["id"] for n in (0, 2)}
    assert filed == {e.external_reference for e in effects}
    # The run's history is a write step's: executing under each write's step name, then
    # planning (recorded by think-1) and the answer.
    events = [
        (row["event_type"], row["step"])
        for row in conn.execute(
            # The status moves (the stream's typed events, step.finished..., have a dot).
            "SELECT event_type, step FROM ledgerloop.agent_run_event WHERE run_id = %s "
            "AND event_type NOT LIKE '%%.%%' ORDER BY sequence",
            (run_id,),
        )
    ]
    executing = [step for kind, step in events if kind == "executing"]
    assert executing == [f"tool-0-{calls[0]}", f"tool-0-{calls[2]}"]
    tail = [kind for kind, _ in events][-3:]
    assert tail == ["executing", "planning", "succeeded"], events
    assert ("planning", "think-1") in events
    # The move back to planning committed with the last write's outcome (one transaction,
    # one xid), not in a commit of its own; the first write's outcome moved nothing.
    xids = {
        row["idempotency_key"]: row["xid"]
        for row in conn.execute(
            "SELECT idempotency_key, xmin::text AS xid FROM ledgerloop.activity_effect "
            "WHERE run_id = %s",
            (run_id,),
        )
    }
    planned = conn.execute(
        "SELECT xmin::text AS xid FROM ledgerloop.agent_run_event "
        "WHERE run_id = %s AND step = 'think-1'",
        (run_id,),
    ).fetchone()
    assert planned is not None
    assert planned["xid"] == xids[f"{run_id}:{calls[2]}"]
    assert planned["xid"] != xids[f"{run_id}:{calls[0]}"]


def _executing_xids(conn: Conn, run_id: Any) -> dict[str, str]:
    """{write step name: the xid of the transaction that moved the run to executing for it}
    (the write's own record: its event row is written once, never updated)."""
    return {
        row["step"]: row["xid"]
        for row in conn.execute(
            "SELECT step, xmin::text AS xid FROM ledgerloop.agent_run_event "
            "WHERE run_id = %s AND event_type = 'executing'",
            (run_id,),
        )
    }


def _checkpoint_xid(conn: Conn, run_id: Any, step: str) -> str:
    row = conn.execute(
        "SELECT xmin::text AS xid FROM dbos.operation_outputs "
        "WHERE workflow_uuid = %s AND function_name = %s",
        (str(run_id), step),
    ).fetchone()
    assert row is not None, f"no checkpoint of {step}"
    xid: str = row["xid"]
    return xid


def test_a_write_that_opens_a_turn_is_recorded_with_the_answer_that_asked_for_it(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    tickets: TicketServiceThread,
    captured: Captured,
) -> None:
    """The first write of a turn that rides the next think step is recorded in think-0's
    own checkpoint transaction (agent.write_ahead): the answer and the effect commit
    together. The next step sends it at once, and its tool span takes the span id the
    recorded delivery already names."""
    model = scripted_model(
        """
default:
  turns:
    - tool_use:
        - {name: ticket_idempotent, input: {title: ahead}}
        - {name: ticket_idempotent, input: {title: after}}
    - text: done
"""
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file two")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert journal_steps(conn, run_id) == ["memory-load", "think-0", "think-1"]
    assert _stats(tickets)["created"] == 2
    effects = effect_list(conn, run_id=run_id)
    assert [e.status.value for e in effects] == ["succeeded", "succeeded"]
    first, second = (b["id"] for b in model.requests()[1]["request"]["messages"][-2]["content"])
    xids = _executing_xids(conn, run_id)
    answer = _checkpoint_xid(conn, run_id, "think-0")
    assert xids[f"tool-0-{first}"] == answer
    # Only the first: the second is recorded by think-1, right before it is sent.
    assert xids[f"tool-0-{second}"] not in (answer, _checkpoint_xid(conn, run_id, "think-1"))
    # The delivery recorded ahead is a child of the tool span think-1 opened for it.
    tools = {
        dict(s.attributes or {})["gen_ai.tool.call.id"]: s
        for s in captured.by_kind("execute_tool ticket_idempotent")
    }
    posts = captured.by_kind("POST")
    linked = {link.context.span_id for post in posts for link in post.links}
    assert tools[first].context.span_id in linked
    assert tools[second].context.span_id in linked
    assert tools[first].context.trace_id == tools[second].context.trace_id
    # The first was sent once think-0 committed it, before think-1 began; the second by
    # think-1, inside its tool span.
    post_of = {link.context.span_id: post for post in posts for link in post.links}
    sent_first = post_of[tools[first].context.span_id].start_time
    sent_second = post_of[tools[second].context.span_id].start_time
    assert sent_first is not None
    assert tools[first].start_time is not None
    assert sent_first < tools[first].start_time, "the write recorded ahead waited for think-1"
    assert sent_second is not None
    assert tools[second].start_time is not None
    assert sent_second > tools[second].start_time
    # Each request the service received carries its own POST span's context.
    received = httpx.get(f"{tickets.url}/_traceparents").json()
    assert sorted(received) == sorted(traceparent(p.context) for p in posts)
    # Both outcomes came back to think-1 from this worker's own delivery: no workflow
    # waited, so no DBOS message was sent for either (migration 0021).
    assert messages_for(conn, run_id) == []


def test_a_write_sent_at_the_answers_commit_moves_the_run_back_with_its_outcome(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """A turn's only write, recorded ahead and sent when think-0 committed it: the record of
    its outcome moves the run back to planning under think-1's name, as think-1 would have
    had it moved (one commit for both)."""
    model = scripted_model(
        """
default:
  turns:
    - tool_use: {name: ticket_idempotent, input: {title: alone}}
    - text: done
"""
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file one")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    (call_id,) = (b["id"] for b in model.requests()[1]["request"]["messages"][-2]["content"])
    assert _executing_xids(conn, run_id)[f"tool-0-{call_id}"] == _checkpoint_xid(
        conn, run_id, "think-0"
    )
    moved = conn.execute(
        "SELECT e.xmin::text = f.xmin::text AS together, count(*) OVER () AS moves "
        "FROM ledgerloop.agent_run_event e, ledgerloop.activity_effect f "
        "WHERE e.run_id = %(id)s AND e.event_type = 'planning' AND e.step = 'think-1' "
        "AND f.run_id = %(id)s",
        {"id": run_id},
    ).fetchall()
    assert [(r["together"], r["moves"]) for r in moved] == [(True, 1)], moved


def test_a_write_is_recorded_ahead_only_when_it_opens_the_turn_and_settles_alone(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """A write after a read, and a write to a destination that neither honours the key nor
    can be looked up (a crash between the steps would leave it to a person), are recorded
    in the step that sends them."""
    model = scripted_model(
        """
conversations:
  - match: READ FIRST
    turns:
      - tool_use:
          - {name: echo, input: {text: before}}
          - {name: ticket_idempotent, input: {title: second}}
      - text: done
  - match: PLAIN
    turns:
      - tool_use: {name: ticket_plain, input: {title: plain}}
      - text: done
"""
    )
    worker(model.url)
    for message in ("READ FIRST", "PLAIN"):
        run_id = start_test_run(conn, "writer", message)
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
        (xid,) = _executing_xids(conn, run_id).values()
        assert xid != _checkpoint_xid(conn, run_id, "think-0"), message
    assert _stats(tickets)["created"] == 2


def test_a_compensable_write_in_a_think_step_is_undone_when_the_run_fails(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """The write's compensation is remembered from the think step's journaled record: the
    run's failure (the model's 500) closes the ticket it filed."""
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_undoable, input: {title: undo}}}, "
        "{status: 500}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file then fail")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "model_call_failed"
    assert [c["status"] for c in run.state["compensations"]] == ["succeeded"]
    stats = _stats(tickets)
    assert (stats["created"], stats["closed"]) == (1, 1)
    assert "think-1" in journal_steps(conn, run_id)
    assert not any(s.startswith("tool-") for s in journal_steps(conn, run_id))


def test_a_write_that_does_not_settle_at_once_waits_then_thinks_again(
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    worker: Any,
    tickets: TicketServiceThread,
    tmp_path: Path,
    captured: Captured,
) -> None:
    """No relay runs yet, so think-1 records the write and ends there, without a model call;
    the run waits for the outcome durably. A relay started later delivers it; the run then
    runs the turn's remaining call as a step of its own and asks the model in
    think-1-settled."""
    model = scripted_model(
        """
default:
  turns:
    - tool_use:
        - {name: ticket_idempotent, input: {title: later}}
        - {name: echo, input: {text: after}}
    - text: done
"""
    )
    worker(model.url, relay=False)
    run_id = start_test_run(conn, "writer", "file once")
    wait_until(lambda: "think-1" in journal_steps(conn, run_id), timeout=20)
    assert [e.status.value for e in effect_list(conn, run_id=run_id)] == ["pending"]
    assert [r["turn"] for r in model.requests()] == [0]  # think-1 asked nothing yet
    env = worker_env(
        db_url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
    )
    relay = start_relay(env, log=tmp_path / "relay.log")
    try:
        run = wait_terminal(conn, run_id, timeout=60)
    finally:
        stop_worker(relay)
    assert run.status is RunStatus.SUCCEEDED, run.state
    steps = journal_steps(conn, run_id)
    assert steps[:3] == ["memory-load", "think-0", "think-1"], steps
    assert steps[-1] == "think-1-settled", steps
    requests = model.requests()
    calls = [b["id"] for b in requests[1]["request"]["messages"][-2]["content"]]
    assert f"tool-0-{calls[1]}" in steps  # the read after the pending write: its own step
    assert any(s.startswith(f"outcome-0-{calls[0]}-") for s in steps), steps
    # One model call per turn: the think step that ended at the write made none.
    assert [r["turn"] for r in requests] == [0, 1]
    results = _tool_results(requests[1])
    assert [r["tool_use_id"] for r in results] == calls
    assert not any(r["is_error"] for r in results)
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"
    assert _stats(tickets)["created"] == 1
    # The run's agent metrics count the model calls made, not the think steps: two.
    assert _metric_sums(captured) == {
        "gen_ai.invoke_agent.inference_calls": 2,
        "gen_ai.invoke_agent.tool_calls": 2,
    }


def test_a_write_that_may_need_an_approval_keeps_its_own_step(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """urgent_ticket's policy asks for a person: its turn is not folded into a think step
    (the run waits for the approval in approve-0-{call_id})."""
    model = scripted_model(
        "default: {turns: [{tool_use: {name: urgent_ticket, input: {title: x}}}, {text: done}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "urgent")

    def asked() -> bool:
        return any(s.startswith("approve-0-") for s in journal_steps(conn, run_id))

    wait_until(asked, timeout=20)
    assert "think-1" not in journal_steps(conn, run_id)
    assert _stats(tickets)["created"] == 0


def test_a_write_settled_by_someone_else_first_is_answered_with_the_rows_outcome(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """While this worker's delivery is under way (a slow downstream), the effect is settled
    by someone else (a hand-written UPDATE, as an operator's tool could make it). The think
    step asked the model with the downstream's answer while the record was being written;
    the record finds the effect no longer its own, so that answer is dropped and the model
    hears the row's outcome in think-1-settled."""
    httpx.post(
        f"{tickets.url}/_faults", json={"mode": "slow", "delay_ms": 700, "kind": "idempotent"}
    ).raise_for_status()
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_idempotent, input: {title: x}}}, {text: done}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")
    wait_until(lambda: _stats(tickets)["requests"] == 1, timeout=20)
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "started"
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'failed', error = 'settled elsewhere', "
        "updated_at = now() WHERE idempotency_key = %s",
        (effect.key,),
    )
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert journal_steps(conn, run_id)[-1] == "think-1-settled"
    requests = model.requests()
    # think-1's model call (made with the downstream's answer) was dropped, and paid for.
    assert [r["turn"] for r in requests] == [0, 1, 1]
    (result,) = _tool_results(requests[-1])
    assert result["is_error"]
    assert result["content"] == "settled elsewhere"
    (effect,) = effect_list(conn, run_id=run_id)
    assert (effect.status.value, effect.error) == ("failed", "settled elsewhere")


def test_a_write_its_delivery_did_not_settle_is_awaited_and_its_outcome_heard(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """A write this worker's relay delivers is recorded not awaited: its step takes the
    outcome from the delivery. When the delivery does not settle it (a 503: the relay
    retries later), the step marks the effect awaited before it waits for a message, so the
    retry's outcome reaches the run as one; unmarked, the run would wait until its
    deadline."""
    httpx.post(
        f"{tickets.url}/_faults", json={"mode": "fail_before_commit", "kind": "idempotent"}
    ).raise_for_status()
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_idempotent, input: {title: x}}}, {text: done}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")
    run = wait_terminal(conn, run_id, timeout=30)
    assert run.status is RunStatus.SUCCEEDED, run.state
    (effect,) = effect_list(conn, run_id=run_id)
    assert (effect.status.value, effect.attempts) == ("succeeded", 2)
    assert _stats(tickets)["created"] == 1
    assert [m["message"]["status"] for m in messages_for(conn, run_id, effect.key)] == ["succeeded"]
