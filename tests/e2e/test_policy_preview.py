"""What the approver reads comes from the policy's summary template, or else from the tool's
own preview, and reaches both GET /v1/approvals and the approval page.

A real worker runs the refund agent (tests/support/refund_agents.py) to the approval, the
real HTTP server serves the API and the page, headless Chromium reads it and approves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from ledgerloop.approvals.store import approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal
from tests.e2e.conftest import MakeToken, bearer
from tests.e2e.test_approval_page import page, sign_in
from tests.integration.conftest import tickets, worker
from tests.support.refund_policy import REFUND_MODULES, write_refund_policy

pytestmark = pytest.mark.e2e
__all__ = ["page", "tickets", "worker"]  # fixtures shared with other modules

SCRIPT = """
default:
  turns:
    - tool_use:
        name: refund
        input: {amount_cents: 7500, customer: {name: acme, country: DE}, reason: broken}
    - text: "Refunded."
"""


@pytest.mark.parametrize(
    ("rules", "summary"),
    [
        ({}, "Refund 7500 cents to acme (DE)"),  # the policy's template
        ({"summary": None}, "refund 7500 cents to acme (tool's own preview)"),
    ],
    ids=["policy-template", "tool-preview"],
)
def test_the_preview_is_shown_in_the_api_and_on_the_page(
    rules: dict[str, Any],
    summary: str,
    page: Page,
    http: httpx.Client,
    conn: Conn,
    make_token: MakeToken,
    scripted_model: Any,
    worker: Any,
    tickets: TicketServiceThread,
    tmp_path: Path,
) -> None:
    model = scripted_model(SCRIPT)
    worker(
        model.url, policy_file=write_refund_policy(tmp_path, **rules), agent_modules=REFUND_MODULES
    )
    run_id = start_test_run(conn, "refunder", "refund acme")
    wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=20)
    token = make_token("approver", name="ana@example.com")

    listed = http.get("/v1/approvals", params={"run_id": str(run_id)}, headers=bearer(token))
    assert listed.status_code == 200
    (approval,) = listed.json()["approvals"]
    assert approval["preview"]["summary"] == summary
    assert approval["preview"]["tool"] == "refund"

    sign_in(page, token)
    card = page.locator(f'li.approval[data-approval-id="{approval["id"]}"]')
    expect(card.locator(".summary")).to_have_text(summary)
    expect(card.locator(".tool")).to_have_text("refund")
    card.locator(".approve").click()
    expect(page.locator("#notice")).to_contain_text("approved: refund")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
