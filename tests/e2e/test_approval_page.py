"""The approval page in headless Chromium (Debian's, since no browser can be downloaded here),
driven by Playwright against a real server and database."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from dbos import DBOSClient
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from ledgerloop.approvals.store import ApprovalStatus, approval_get
from ledgerloop.control.cancel import cancel_run
from ledgerloop.db.connect import Conn
from tests.e2e.conftest import MakeToken, ServerThread, run_awaiting_approval

pytestmark = pytest.mark.e2e


@pytest.fixture
def page(browser: Browser, server: ServerThread) -> Iterator[Page]:
    """A fresh page on the approval page; fails the test on any script error or CSP report."""
    context = browser.new_context(base_url=server.url)
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def console(message: ConsoleMessage) -> None:
        # A failed API call logs its status as a console error; those are expected here.
        if message.type == "error" and "status of" not in message.text:
            problems.append(f"console: {message.text}")

    opened.on("console", console)
    response = opened.goto("/approvals")
    assert response is not None
    assert "script-src 'self'" in response.headers["content-security-policy"]
    yield opened
    context.close()
    assert problems == []


def sign_in(page: Page, token: str) -> None:
    page.fill("#token", token)
    page.click("#login button[type=submit]")


def test_an_approver_approves_from_the_page(page: Page, conn: Conn, make_token: MakeToken) -> None:
    arguments = {"title": "Disk full on db-1", "priority": "high", "api_key": "sk-live-123"}
    expires_at = datetime.now(UTC) + timedelta(hours=8)
    approval = run_awaiting_approval(conn, arguments=arguments, expires_at=expires_at)
    token = make_token("approver", name="ana@example.com")

    sign_in(page, token)
    card = page.locator(f'li.approval[data-approval-id="{approval.id}"]')
    expect(card.locator(".summary")).to_have_text("Open ticket Disk full on db-1")
    expect(card.locator(".tool")).to_have_text("write_ticket")
    # Each argument in its own row, its value as JSON in its own box.
    expect(card.locator(".arguments th")).to_have_text(["title", "priority"])
    expect(card.locator(".arguments code.argument-value")).to_have_text(
        ['"Disk full on db-1"', '"high"']
    )
    expect(card.locator(".lines")).to_be_hidden()
    expect(card.locator(".note")).to_contain_text("api_key")
    expect(card.locator(".hash")).to_have_text(approval.action_hash)
    expires = card.locator(".expires")
    expect(expires).to_have_attribute("datetime", re.compile(f"^{expires_at:%Y-%m-%dT%H:%M:%S}"))
    expect(expires).to_contain_text(re.compile(r"\(in (7 h 59|8 h 0) min\)"))
    expect(card.locator(".run")).to_have_text(str(approval.run_id))
    assert "sk-live-123" not in page.content()  # the preview hides secret-looking arguments
    # The token lives in this tab's sessionStorage only, never in the page or localStorage.
    assert page.evaluate("sessionStorage.getItem('ledgerloop.token')") == token
    assert page.evaluate("localStorage.length") == 0
    assert token not in page.content()

    card.locator(".reason").fill("matches the incident")
    card.locator(".approve").click()

    expect(page.locator("#notice")).to_contain_text("approved: write_ticket")
    expect(page.locator("#notice")).to_contain_text("by ana@example.com")
    expect(card).to_have_count(0)  # the list refreshed: nothing pending any more
    expect(page.locator("#empty")).to_be_visible()
    decided = approval_get(conn, approval.id)
    assert decided is not None
    assert decided.status is ApprovalStatus.APPROVED
    assert decided.decided_by_name == "ana@example.com"
    assert decided.reason == "matches the incident"


def test_a_bad_token_is_shown_plainly(page: Page) -> None:
    sign_in(page, "llt_not-a-real-token")
    expect(page.locator("#error")).to_have_text(
        "401 unauthenticated: Invalid or revoked token. "
        "(present a current token issued by `ledgerloop approvers add`)"
    )
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#queue")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('ledgerloop.token')") is None


def test_refusals_are_shown_verbatim(
    page: Page, conn: Conn, make_token: MakeToken, dbos_client: DBOSClient
) -> None:
    approval = run_awaiting_approval(conn)
    sign_in(page, make_token("viewer", name="vic@example.com"))
    card = page.locator(f'li.approval[data-approval-id="{approval.id}"]')

    card.locator(".approve").click()  # a viewer may look, not decide
    expect(page.locator("#error")).to_have_text(
        f"403 forbidden: deciding approval {approval.id} needs one of the roles approver; "
        "this principal has viewer (use a principal with one of those roles)"
    )
    expect(card.locator(".approve")).to_be_enabled()

    page.click("#forget")
    sign_in(page, make_token("approver"))
    # The page lists the approval again before anyone cancels: signing in reloads the list,
    # and a reload after the cancel would (rightly) no longer show it.
    expect(card.locator(".reject")).to_be_visible()
    # Meanwhile, someone cancels.
    cancel_run(conn, approval.run_id, workflows=dbos_client, requested_by="test")
    card.locator(".reject").click()
    expect(page.locator("#error")).to_contain_text("409 approval_conflict: approval")
    expect(page.locator("#error")).to_contain_text("is cancelled; it can no longer be decided")


def test_a_bidi_override_is_shown_escaped_on_the_page(
    page: Page, conn: Conn, make_token: MakeToken
) -> None:
    arguments = {"title": "invoice_\u202efdp.exe", "priority": "low" + "\n" * 30 + "high"}
    approval = run_awaiting_approval(conn, arguments=arguments)
    sign_in(page, make_token("approver"))
    card = page.locator(f'li.approval[data-approval-id="{approval.id}"]')
    values = card.locator(".arguments code.argument-value")
    expect(values).to_have_text(['"invoice_\\u202efdp.exe"', '"low' + "\\n" * 30 + 'high"'])
    assert "\u202e" not in page.content()
