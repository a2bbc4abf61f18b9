"""MCP tools end to end: discovery journaled once, reads inline, writes through the outbox.

Real Postgres, a real DBOS worker with the relay and the reconciler, the real SDK against the
scripted model, and the example MCP ticket server (official `mcp` SDK) over streamable HTTP
(a thread) and over stdio (a subprocess the worker and the relay each start).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.trace import SpanKind, StatusCode

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.mcp_ticket_server import META_IDEMPOTENCY_KEY, McpTicketServerThread
from ledgerloop.mcptools.client import META_IDEMPOTENCY_KEY as CLIENT_META_KEY
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.telemetry.runtrace import parse_traceparent, root_span_id, run_trace_id
from ledgerloop.testing.postgres import wait_until
from tests.conftest import REPO, journal_steps, start_test_run, wait_terminal
from tests.support.garbled_mcp import GarbledMcpServerThread
from tests.support.telemetry import Captured

AGENTS = "tests.support.mcp_agents"


@pytest.fixture
def mcp_server() -> Iterator[McpTicketServerThread]:
    with McpTicketServerThread() as server:
        yield server


STDIO = {
    "transport": "stdio",
    "command": ["{python}", "-m", "ledgerloop.examples.mcp_ticket_server"],
    "timeout_s": 20,
    "read_tools": ["find_ticket_by_key", "search_tickets"],
    "write_tools": {"create_ticket": {"idempotent": True}},
}


def policy_for(
    tmp_path: Path, url: str = "http://127.0.0.1:9/mcp", *, approval: bool = False
) -> Path:
    """The test policy with both MCP servers (the HTTP one's URL is known at run time)."""
    rules: dict[str, Any] = {"timeout_ms": 3000, "max_retries": 1, "deadline_s": 20}
    if approval:
        rules["requires_approval"] = True
    policy = {
        "version": "mcp-test-1",
        "tools": {"create_ticket": rules},
        "mcp_servers": {"tickets_http": http_server(url), "tickets_stdio": STDIO},
        "destinations": {"tickets": "http://127.0.0.1:9"},
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def http_server(url: str) -> dict[str, Any]:
    return {
        "transport": "streamable_http",
        "url": url,
        "timeout_s": 5,
        "read_tools": ["find_ticket_by_key", "search_tickets"],
        "write_tools": {
            "create_ticket": {"idempotent": True, "lookup_tool": "find_ticket_by_key"},
        },
    }


def _results(model: Any, request: int) -> list[dict[str, Any]]:
    last = model.requests()[request]["request"]["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def _script(*turns: dict[str, Any]) -> str:
    return json.dumps({"default": {"turns": [*turns, {"text": "done"}]}})


def test_http_write_through_the_outbox_then_read_inline_with_mcp_span_attributes(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    mcp_server: McpTicketServerThread,
    captured: Captured,
    tmp_path: Path,
) -> None:
    model = scripted_model(
        _script(
            {"tool_use": {"name": "create_ticket", "input": {"title": "disk full on db-1"}}},
            {"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}},
        )
    )
    worker(
        model.url,
        agent_modules=AGENTS,
        policy_file=policy_for(tmp_path, mcp_server.url),
    )
    run_id = start_test_run(conn, "mcp_http", "file it")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    # The model saw the MCP tools, as discovered once by this run.
    offered = {t["name"] for t in model.requests()[0]["request"]["tools"]}
    assert {"create_ticket", "search_tickets", "find_ticket_by_key"} <= offered
    assert journal_steps(conn, run_id).count("mcp-discover") == 1
    # The write went through the outbox with the effect's key in _meta.
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"
    assert effect.destination == "tickets_http"
    (created,) = _results(model, 1)
    ticket = json.loads(created["content"])
    assert ticket["idempotency_key"] == effect.key
    assert META_IDEMPOTENCY_KEY == CLIENT_META_KEY
    assert mcp_server.store.stats()["created"] == 1
    # The read ran inline and found it.
    (found,) = _results(model, 2)
    assert json.loads(found["content"])["tickets"][0]["id"] == ticket["id"]
    # One execute_tool span per call, carrying the MCP attributes; no second span for it.
    spans = captured.spans.get_finished_spans()
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert sorted(s.name for s in tools) == [
        "execute_tool create_ticket",
        "execute_tool search_tickets",
    ]
    assert not [s for s in spans if s.name.startswith("MCP send")]
    assert not [s for s in spans if "://" in s.name]
    # The relay's delivery of the write: one CLIENT span in the run's trace, under its root,
    # linked to the tool span that recorded the effect, and the one the server's request
    # named in its _meta.
    trace_id = run_trace_id(run_id)
    (delivered,) = [s for s in spans if "tools/call" in s.name]
    assert delivered.name == "tools/call create_ticket"
    assert delivered.kind is SpanKind.CLIENT
    assert delivered.context is not None
    assert delivered.context.trace_id == trace_id
    assert delivered.parent is not None
    assert delivered.parent.span_id == root_span_id(trace_id)
    created_by = next(s for s in tools if s.name == "execute_tool create_ticket")
    assert created_by.context is not None
    assert [link.context.span_id for link in delivered.links] == [created_by.context.span_id]
    sent = dict(delivered.attributes or {})
    assert sent["mcp.method.name"] == "tools/call"
    assert sent["gen_ai.tool.name"] == "create_ticket"
    assert sent["network.transport"] == "tcp"
    assert sent["mcp.session.id"]
    assert sent["mcp.protocol.version"]
    assert sent["jsonrpc.request.id"]  # the SDK's attributes, merged into the delivery span
    assert sent["ledgerloop.effect.idempotency_key"] == effect.key
    assert sent["ledgerloop.effect.attempt"] == 1
    assert sent["ledgerloop.effect.status"] == "succeeded"
    assert "error.type" not in sent
    (received,) = mcp_server.store.traceparents()
    context = parse_traceparent(received)
    assert context is not None
    assert (context.trace_id, context.span_id) == (trace_id, delivered.context.span_id)
    read = next(s for s in tools if s.name == "execute_tool search_tickets")
    attrs = dict(read.attributes or {})
    assert attrs["mcp.method.name"] == "tools/call"
    assert attrs["network.transport"] == "tcp"
    assert attrs["mcp.session.id"]
    assert attrs["mcp.protocol.version"]
    assert attrs["jsonrpc.request.id"]  # put there by the SDK, merged into our span
    assert attrs["server.port"] == mcp_server.port
    write = dict(next(s for s in tools if s.name == "execute_tool create_ticket").attributes or {})
    assert write["mcp.method.name"] == "tools/call"
    assert write["ledgerloop.effect.idempotency_key"] == effect.key


class _SessionEndsSeen(McpTicketServerThread):
    """The ticket server, counting the DELETEs that end an MCP session over HTTP."""

    ended = 0

    def app(self) -> Any:
        inner = super().app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "DELETE":
                self.ended += 1
            await inner(scope, receive, send)

        return app


def test_a_stopped_worker_ends_its_mcp_sessions(
    conn: Conn, scripted_model: Any, worker: Any, tmp_path: Path
) -> None:
    # Left open, a session's task was cancelled by the loop's own shutdown, together with
    # whatever its HTTP client started while unwinding: a task the closed loop never ran.
    with _SessionEndsSeen() as server:
        model = scripted_model(
            _script({"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}})
        )
        running = worker(
            model.url, agent_modules=AGENTS, policy_file=policy_for(tmp_path, server.url)
        )
        run_id = start_test_run(conn, "mcp_http", "look")
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
        assert server.ended == 0
        running.stop()
        assert server.ended == 1


@pytest.fixture
def other_mcp_server() -> Iterator[McpTicketServerThread]:
    with McpTicketServerThread() as server:
        yield server


def test_two_agents_with_same_named_write_tools_each_reach_their_own_server(
    conn: Conn,
    scripted_model: Any,
    other_mcp_server: McpTicketServerThread,  # before the worker: stopped after it
    mcp_server: McpTicketServerThread,
    worker: Any,
    tmp_path: Path,
) -> None:
    model = scripted_model(
        _script({"tool_use": {"name": "create_ticket", "input": {"title": "disk full"}}})
    )
    path = policy_for(tmp_path, mcp_server.url, approval=True)
    policy = yaml.safe_load(path.read_text())
    policy["mcp_servers"]["tickets_other"] = http_server(other_mcp_server.url)
    path.write_text(yaml.safe_dump(policy))
    worker(model.url, agent_modules=f"{AGENTS},tests.support.mcp_other_agent", policy_file=path)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])

    def pending(run_id: uuid.UUID) -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    # Both runs discover their create_ticket before either writes: the second discovery must
    # not take over the first run's tool (it did, when discovered tools were kept by name).
    first = start_test_run(conn, "mcp_http", "file it")
    first_approval = wait_until(lambda: pending(first), timeout=30)
    second = start_test_run(conn, "mcp_http_other", "file it")
    second_approval = wait_until(lambda: pending(second), timeout=30)
    for run_id, approval in ((first, first_approval), (second, second_approval)):
        approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
        run = wait_terminal(conn, run_id)
        assert run.status is RunStatus.SUCCEEDED, run.state
    (first_effect,) = effect_list(conn, run_id=first)
    (second_effect,) = effect_list(conn, run_id=second)
    assert (first_effect.status.value, first_effect.destination) == ("succeeded", "tickets_http")
    assert (second_effect.status.value, second_effect.destination) == (
        "succeeded",
        "tickets_other",
    )
    assert [t.idempotency_key for t in mcp_server.store.all()] == [first_effect.key]
    assert [t.idempotency_key for t in other_mcp_server.store.all()] == [second_effect.key]


def test_stdio_server_read_and_write(
    conn: Conn, scripted_model: Any, worker: Any, tmp_path: Path
) -> None:
    model = scripted_model(
        _script(
            {"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}},
            {"tool_use": {"name": "create_ticket", "input": {"title": "disk full"}}},
        )
    )
    worker(
        model.url,
        agent_modules=AGENTS,
        policy_file=policy_for(tmp_path),
    )
    run_id = start_test_run(conn, "mcp_stdio", "file it")
    run = wait_terminal(conn, run_id, timeout=90)
    assert run.status is RunStatus.SUCCEEDED, run.state
    (searched,) = _results(model, 1)
    assert json.loads(searched["content"]) == {"tickets": []}
    (created,) = _results(model, 2)
    assert not created["is_error"], created
    (effect,) = effect_list(conn, run_id=run_id)
    assert json.loads(created["content"])["idempotency_key"] == effect.key


def test_a_server_that_is_down_is_a_clear_tool_error_and_nothing_is_lost(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    mcp_server: McpTicketServerThread,
    tmp_path: Path,
) -> None:
    model = scripted_model(
        _script(
            {"tool_use": {"name": "create_ticket", "input": {"title": "disk full"}}},
            {"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}},
        )
    )
    worker(
        model.url,
        agent_modules=AGENTS,
        policy_file=policy_for(tmp_path, mcp_server.url, approval=True),
    )
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "mcp_http", "file it")

    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    # The tools were discovered, and the run waits for a person: now the server goes away.
    approval = wait_until(pending, timeout=30)
    store = mcp_server.store
    mcp_server.stop()
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, run.state
    # The write could not be delivered: nothing was sent, it failed cleanly after its retries.
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "failed"
    assert "cannot connect to MCP server tickets_http" in (effect.error or "")
    (written,) = _results(model, 1)
    assert written["is_error"]
    # The read is a clear tool error for the model, and the run went on.
    (searched,) = _results(model, 2)
    assert searched["is_error"]
    assert "cannot connect to MCP server tickets_http" in searched["content"]
    assert store.stats()["created"] == 0


def test_a_server_answering_garbage_over_http_is_a_tool_error_and_its_write_is_reconciled(
    conn: Conn, scripted_model: Any, worker: Any, tmp_path: Path, captured: Captured
) -> None:
    # The server runs both calls, then answers the write with a body that is not JSON and
    # the read with a JSON-RPC result that is not a tool result.
    garble = {"create_ticket": "not-json", "search_tickets": "bad-result"}
    with GarbledMcpServerThread(garble) as server:
        model = scripted_model(
            _script(
                {"tool_use": {"name": "create_ticket", "input": {"title": "disk full"}}},
                {"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}},
            )
        )
        worker(model.url, agent_modules=AGENTS, policy_file=policy_for(tmp_path, server.url))
        run_id = start_test_run(conn, "mcp_http", "file it")
        run = wait_terminal(conn, run_id, timeout=60)
        tickets = server.store.all()
    assert run.status is RunStatus.SUCCEEDED, run.state
    # The read: a clear error the model reads, and the run went on.
    (searched,) = _results(model, 2)
    assert searched["is_error"]
    assert "search_tickets failed" in searched["content"]
    assert "tools/call search_tickets on MCP server tickets_http" in searched["content"]
    # The write happened at the server, but its answer proved nothing: outcome unknown,
    # then the reconciler's lookup found the ticket. Never taken for a plain success or a
    # failure, and exactly one ticket.
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"
    assert len(tickets) == 1
    assert effect.external_reference == tickets[0].id
    evidence = effect.evidence or {}
    assert evidence["reconciler"]["from_status"] == "outcome_unknown"
    assert "Failed to parse JSON response" in evidence["last_error"]
    assert evidence["reconciler"]["lookup"]["answer"] == "found"
    # The delivery span says so too: the attempt's outcome was unknown, and the error is the
    # JSON-RPC code the SDK reported the unreadable answer with (the MCP conventions).
    (delivered,) = captured.by_kind("tools/call create_ticket")
    attrs = dict(delivered.attributes or {})
    assert attrs["ledgerloop.effect.status"] == "outcome_unknown"
    assert attrs["error.type"] == attrs["rpc.response.status_code"] == "-32700"
    assert delivered.status.status_code is StatusCode.ERROR


def test_a_stdio_server_printing_garbage_is_a_tool_error_and_its_write_goes_to_a_person(
    conn: Conn, scripted_model: Any, worker: Any, tmp_path: Path
) -> None:
    model = scripted_model(
        _script(
            {"tool_use": {"name": "search_tickets", "input": {"word": "disk"}}},
            {"tool_use": {"name": "create_ticket", "input": {"title": "disk full"}}},
        )
    )
    stdio = {
        **STDIO,
        "command": [
            "{python}",
            "-m",
            "tests.support.garbled_stdio",
            "create_ticket",
            "search_tickets",
        ],
        "env": {"PYTHONPATH": str(REPO)},
        "timeout_s": 2,
        "write_tools": {"create_ticket": {}},  # neither idempotent nor a lookup
    }
    path = policy_for(tmp_path)
    policy = yaml.safe_load(path.read_text())
    policy["mcp_servers"]["tickets_stdio"] = stdio
    path.write_text(yaml.safe_dump(policy))
    worker(model.url, agent_modules=AGENTS, policy_file=path)
    run_id = start_test_run(conn, "mcp_stdio", "file it")
    (searched,) = wait_until(
        lambda: _results(model, 1) if len(model.requests()) > 1 else None, timeout=90
    )
    assert searched["is_error"]
    assert (
        "no answer to tools/call search_tickets on MCP server tickets_stdio"
        in (searched["content"])
    )

    def parked() -> Any:
        effects = effect_list(conn, run_id=run_id)
        if not effects or effects[0].status.value != "needs_human":
            return None
        waiting = run_require(conn, run_id).status is RunStatus.RECONCILING
        return effects[0] if waiting else None

    # The write's answer was garbage: the outcome is unknown, and with neither idempotency
    # nor a lookup to settle it, a person decides. The run waits for them.
    effect = wait_until(parked, timeout=90)
    assert "outcome unknown" in (effect.evidence or {})["reconciler"]["reason"]
