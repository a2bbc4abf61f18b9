"""A destination's behaviour declared in one place, the policy file's `destinations:` entry.

The `pay` tool's code declares neither idempotency nor a lookup (tests/support/refund_agents.py);
its destination's entry in the policy gives the lookup. The ticket service commits the payout
and drops the connection: with the entry, the reconciler asks the lookup and settles it;
without it, the effect waits for a person, and the message says where to declare the lookup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal
from tests.support.refund_policy import REFUND_MODULES, write_refund_policy

SCRIPT = "default: {turns: [{tool_use: {name: pay, input: {title: payout}}}, {text: paid}]}"


def _created(tickets: TicketServiceThread) -> int:
    return int(httpx.get(f"{tickets.url}/_stats").json()["created"])


def _start(
    scripted_model: Any, worker: Any, tmp_path: Path, payments: str | dict[str, Any]
) -> None:
    model = scripted_model(SCRIPT)
    policy = write_refund_policy(tmp_path, payments=payments)
    worker(model.url, policy_file=policy, agent_modules=REFUND_MODULES)


def test_the_destinations_lookup_settles_an_unknown_outcome(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    httpx.post(
        f"{tickets.url}/_faults", json={"mode": "commit_then_drop", "kind": "lookup"}
    ).raise_for_status()
    entry = {"url": tickets.url, "lookup_path": "/lookup/tickets/by-key/{key}"}
    _start(scripted_model, worker, tmp_path, entry)
    run_id = start_test_run(conn, "payer", "pay out")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"
    assert effect.external_reference == "TCK-000001"
    assert _created(tickets) == 1  # found by the lookup, never sent twice


def test_without_the_entry_a_person_is_asked_and_told_where_to_declare_it(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    httpx.post(
        f"{tickets.url}/_faults", json={"mode": "commit_then_drop", "kind": "lookup"}
    ).raise_for_status()
    _start(scripted_model, worker, tmp_path, tickets.url)  # the plain-URL form
    run_id = start_test_run(conn, "payer", "pay out")

    def parked() -> Any:
        found = effect_list(conn, run_id=run_id, status="needs_human")
        return found[0] if found else None

    effect = wait_until(parked, timeout=20)
    assert "destinations.payments in the policy file" in (effect.error or "")
    assert _created(tickets) == 1


def test_the_destinations_compensation_undoes_a_payout_of_a_failed_run(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    # The code declares no compensation; the destination's entry does.
    model = scripted_model(
        "default: {turns: [{tool_use: {name: pay, input: {title: payout}}}, {status: 500}]}"
    )
    entry = {"url": tickets.url, "compensate_path": "/tickets/{ref}/close"}
    policy = write_refund_policy(tmp_path, payments=entry)
    worker(model.url, policy_file=policy, agent_modules=REFUND_MODULES)
    run_id = start_test_run(conn, "payer", "pay, then fail")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.FAILED
    stats = httpx.get(f"{tickets.url}/_stats").json()
    assert (stats["created"], stats["closed"]) == (1, 1)
    effects = {e.key: e for e in effect_list(conn, run_id=run_id)}
    (original,) = [e for e in effects.values() if e.compensates is None]
    assert effects[original.key + ":compensate"].status.value == "succeeded"
