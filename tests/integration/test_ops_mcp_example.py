"""The shipped `ops_mcp` example under the shipped policy: the ops agent with its tickets over
MCP. A runbook search runs inline, the ticket waits for a person, and once approved goes
through the outbox to the example MCP ticket server exactly once, with the effect's key."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.mcp_ticket_server import McpTicketServerThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from tests.conftest import REPO, start_test_run, wait_terminal

SCRIPT = json.dumps(
    {
        "default": {
            "turns": [
                {"tool_use": {"name": "search_kb", "input": {"query": "disk full"}}},
                {"tool_use": {"name": "create_ticket", "input": {"title": "db-1 disk full"}}},
                {"text": "Filed a ticket for db-1."},
            ]
        }
    }
)


@pytest.fixture
def mcp_server() -> Iterator[McpTicketServerThread]:
    with McpTicketServerThread() as server:
        yield server


def shipped_policy(tmp_path: Path, url: str) -> Path:
    """tool_policy.yaml as shipped, with the MCP ticket server where this test started it."""
    policy = yaml.safe_load((REPO / "tool_policy.yaml").read_text())
    policy["mcp_servers"]["tickets_mcp"]["url"] = url
    path = tmp_path / "tool_policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def test_the_ops_agent_files_its_ticket_over_mcp_once_after_approval(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    mcp_server: McpTicketServerThread,
    tmp_path: Path,
) -> None:
    model = scripted_model(SCRIPT)
    worker(
        model.url,
        agent_modules="ledgerloop.examples.ops_mcp",
        policy_file=shipped_policy(tmp_path, mcp_server.url),
    )
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id: uuid.UUID = start_test_run(conn, "ops_mcp", "db-1 disk is full")

    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    approval = wait_until(pending, timeout=30)
    assert approval.tool == "create_ticket"
    # Nothing reached the ticket system while the action waited for a person.
    assert mcp_server.store.stats()["created"] == 0
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, run.state

    (effect,) = effect_list(conn, run_id=run_id)
    assert (effect.status.value, effect.destination) == ("succeeded", "tickets_mcp")
    (ticket,) = mcp_server.store.all()
    assert ticket.idempotency_key == effect.key
    assert ticket.title == "db-1 disk full"
    # The runbook search ran inline and its result reached the model.
    searched = model.requests()[1]["request"]["messages"][-1]["content"][0]
    assert searched["type"] == "tool_result"
    assert not searched.get("is_error"), searched
    # The model heard back the ticket the server created.
    created = model.requests()[2]["request"]["messages"][-1]["content"][0]
    assert json.loads(created["content"])["id"] == ticket.id
