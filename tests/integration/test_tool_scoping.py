"""Tools resolve within their own agent, and cached read results within their own tenant."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.start import start_run
from tests.conftest import wait_terminal

SEND_SCRIPT = """
default:
  turns:
    - tool_use: {name: send, input: {text: hello}}
    - text: sent
"""

WHOSE_SCRIPT = """
default:
  turns:
    - tool_use: {name: whose, input: {}}
    - text: done
"""


def _created(service: TicketServiceThread) -> int:
    created: int = httpx.get(f"{service.url}/_stats").json()["created"]
    return created


def test_two_agents_with_one_tool_name_each_reach_their_own_destination(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(SEND_SCRIPT)
    with TicketServiceThread() as alpha, TicketServiceThread() as beta:
        worker(
            model.url, destinations={"tickets": tickets.url, "alpha": alpha.url, "beta": beta.url}
        )
        runs = {
            name: start_run(conn, agent=name, input={"message": f"send as {name}"})
            for name in ("alpha", "beta")
        }
        for run_id in runs.values():
            assert wait_terminal(conn, run_id).status.value == "succeeded"
        for name, run_id in runs.items():
            (effect,) = effect_list(conn, run_id=run_id)
            assert effect.destination == name
            assert effect.status.value == "succeeded"
            assert effect.result["title"] == f"{name}: hello"
        assert (_created(alpha), _created(beta), _created(tickets)) == (1, 1, 0)


def test_a_tenant_never_gets_another_tenants_cached_result(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = tmp_path / "tools.log"
    monkeypatch.setenv("LEDGERLOOP_TEST_TOOL_LOG", str(log))
    model = scripted_model(WHOSE_SCRIPT)
    worker(model.url, relay=False)
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    answers = []
    for tenant in (tenant_a, tenant_b, tenant_a):
        run_id = start_run(conn, agent="looper", input={"message": "who?"}, tenant_id=tenant)
        assert wait_terminal(conn, run_id).status.value == "succeeded"
        last = model.requests()[-1]["request"]["messages"][-1]
        (result,) = [b for b in last["content"] if b.get("type") == "tool_result"]
        answers.append(result["content"])
    assert answers == [f"tenant {tenant_a}", f"tenant {tenant_b}", f"tenant {tenant_a}"]
    # Tenant A's second call came from the cache; tenant B's never did.
    assert log.read_text().splitlines() == [f"whose:{tenant_a}", f"whose:{tenant_b}"]
