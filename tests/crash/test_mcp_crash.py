"""Kill the relay (SIGKILL) at each boundary of an MCP write tool, restart it, and check that
the MCP ticket server created at most one ticket, exactly one when the run says it succeeded.

The write tool honours the idempotency key the relay puts in `_meta`, so a resend after a
crash returns the original ticket instead of filing a second one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.mcp_ticket_server import McpTicketServerThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import (
    REPO,
    release,
    standby_relay,
    start_relay,
    start_worker,
    stop_all,
    worker_env,
)
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

RELAY_FAULTS = ["relay.before_send", "relay.after_send_before_record", "relay.after_record"]


@pytest.fixture
def mcp_server() -> Iterator[McpTicketServerThread]:
    with McpTicketServerThread() as server:
        yield server


def _run_with_relay_fault(
    fault: str,
    tool: str,
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    mcp_server: McpTicketServerThread,
    tmp_path: Path,
) -> tuple[Any, Any, str]:
    """A run calling `tool` once; the first relay dies at `fault`, a second one takes over."""
    policy = {
        "version": "mcp-crash-1",
        "tools": {tool: {"timeout_ms": 3000}},
        "mcp_servers": {
            "tickets_http": {
                "transport": "streamable_http",
                "url": mcp_server.url,
                "read_tools": ["find_ticket_by_key"],
                "write_tools": {
                    "create_ticket": {"idempotent": True, "lookup_tool": "find_ticket_by_key"},
                    "create_ticket_unkeyed": {},  # neither: unknown outcomes go to a person
                },
            },
            "tickets_stdio": {"transport": "stdio", "command": ["unused"]},
        },
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    turns = [{"tool_use": {"name": tool, "input": {"title": "db-1 disk"}}}]
    model = scripted_model(json.dumps({"default": {"turns": [*turns, {"text": "filed"}]}}))
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.mcp_agents",
        LEDGERLOOP_POLICY_FILE=str(tmp_path / "policy.yaml"),
        LEDGERLOOP_EFFECT_SETTLE_AFTER_S="0.2",
        LEDGERLOOP_RECONCILE_INTERVAL_S="0.2",
        LEDGERLOOP_RELAY_LEASE_MARGIN_S="1",
        PYTHONPATH=str(REPO),
    )
    worker = start_worker(env, "--no-relay", log=tmp_path / "worker.log")
    relay = start_relay({**env, "LEDGERLOOP_FAULTS": fault}, log=tmp_path / "relay-1.log")
    # The relay that takes over, started now and held after its imports: its start-up
    # overlaps the first one's instead of following its death.
    second = standby_relay(env, log=tmp_path / "relay-2.log")
    try:
        run_id = start_test_run(conn, "mcp_http", "file it")
        assert relay.wait(timeout=60) == -9, (tmp_path / "relay-1.log").read_text()
        release(second)
        if tool == "create_ticket":
            run = wait_terminal(conn, run_id, timeout=60)
        else:
            run = wait_until(lambda: _parked(conn, run_id), timeout=60)
    finally:
        stop_all(worker, relay, second)
    logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
    return run, effect_list(conn, run_id=run_id), logs


def _parked(conn: Conn, run_id: Any) -> Any:
    effects = effect_list(conn, run_id=run_id)
    run = run_require(conn, run_id)
    if effects and effects[0].status.value == "needs_human" and run.status.value == "reconciling":
        return run
    return None


@pytest.mark.parametrize("fault", RELAY_FAULTS)
def test_relay_killed_at_each_boundary_of_an_mcp_write_files_at_most_one_ticket(
    fault: str,
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    mcp_server: McpTicketServerThread,
    tmp_path: Path,
) -> None:
    run, effects, logs = _run_with_relay_fault(
        fault, "create_ticket", conn, db_url, scripted_model, mcp_server, tmp_path
    )
    assert run.status is RunStatus.SUCCEEDED, logs
    (effect,) = effects
    assert effect.status.value == "succeeded"
    tickets = mcp_server.store.all()
    assert len(tickets) == 1, tickets
    assert tickets[0].idempotency_key == effect.key
    assert effect.external_reference == tickets[0].id


def test_unknown_outcome_without_idempotency_or_lookup_goes_to_a_person(
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    mcp_server: McpTicketServerThread,
    tmp_path: Path,
) -> None:
    # create_ticket_unkeyed is declared neither idempotent nor with a lookup.
    run, effects, logs = _run_with_relay_fault(
        "relay.after_send_before_record",
        "create_ticket_unkeyed",
        conn,
        db_url,
        scripted_model,
        mcp_server,
        tmp_path,
    )
    assert run.status is RunStatus.RECONCILING, logs
    (effect,) = effects
    assert effect.status.value == "needs_human"
    assert len(mcp_server.store.all()) == 1  # it did happen; nobody sent it again
