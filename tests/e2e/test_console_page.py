"""The run console (/console) in headless Chromium, driven by Playwright against a real
server and database: sign in, runs appearing, a run's timeline growing, approving from it,
and strings that try to be markup or to reorder text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect
from psycopg.types.json import Jsonb

from ledgerloop.approvals.store import ApprovalStatus, approval_get
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require, run_transition
from tests.e2e.conftest import REPO, MakeToken, ServerThread, run_awaiting_approval

pytestmark = pytest.mark.e2e

DOCS = REPO / "docs"


@pytest.fixture
def page(browser: Browser, server: ServerThread) -> Iterator[Page]:
    """A fresh tab on /console; fails the test on any script error or CSP report."""
    context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def console(message: ConsoleMessage) -> None:
        if message.type == "error" and "status of" not in message.text:
            problems.append(f"console: {message.text}")

    opened.on("console", console)
    response = opened.goto("/console")
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    yield opened
    context.close()
    assert problems == []


def sign_in(page: Page, token: str) -> None:
    page.fill("#token", token)
    page.click("#login button[type=submit]")


def test_a_bad_token_is_refused_plainly(page: Page) -> None:
    sign_in(page, "llt_not-a-real-token")
    expect(page.locator("#error")).to_have_text(
        "401 unauthenticated: Invalid or revoked token. "
        "(present a current token issued by `ledgerloop approvers add`)"
    )
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#list-view")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('ledgerloop.token')") is None


def test_a_run_started_over_sql_appears_and_its_steps_arrive(
    page: Page, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer", name="vic@example.com")
    sign_in(page, token)
    expect(page.locator("#list-view")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('ledgerloop.token')") == token
    assert page.evaluate("localStorage.length") == 0

    # Started the way an application's own transaction starts one: no HTTP involved.
    row = conn.execute(
        "SELECT ledgerloop.start_run('ops', %s, 'order-42') AS id",
        (Jsonb({"message": "<img src=x onerror=alert(1)> disk full"}),),
    ).fetchone()
    assert row is not None
    run_id = row["id"]
    listed = page.locator(f'tr[data-run-id="{run_id}"]')
    expect(listed.locator(".status")).to_have_text("received")  # the list follows new runs
    expect(listed.locator(".key")).to_have_text("order-42")
    expect(listed.locator(".agent")).to_have_text("ops")
    page.screenshot(path=DOCS / "console-list.png")

    listed.locator("a.run-link").click()
    expect(page.locator("#run-id")).to_have_text(str(run_id))
    expect(page.locator("#run-status")).to_have_text("received")
    expect(page.locator('li.entry[data-name="received"]')).to_have_count(1)

    # The worker's first move, made here by hand: the open page picks it up by itself.
    run = run_require(conn, run_id)
    run = run_transition(conn, run, RunStatus.PLANNING, "planning", {"turn": 0}).run
    expect(page.locator('li.entry[data-name="planning"]')).to_have_count(1)
    expect(page.locator("#run-status")).to_have_text("planning")
    run_transition(
        conn, run, RunStatus.FAILED, "failed", {"error": "model said <script>alert(1)</script>"}
    )
    failed = page.locator('li.entry[data-name="failed"]')
    expect(failed.locator(".facts")).to_have_text("model said <script>alert(1)</script>")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#cancel")).to_be_hidden()
    assert page.locator("script").count() == 1  # the console's own, nothing from the run
    page.screenshot(path=DOCS / "console-detail.png", full_page=True)

    page.click("h1 a")  # back to the list, with counts by status
    expect(page.locator('#counts li[data-status="failed"]')).to_have_text("failed: 1")


def test_an_approver_approves_from_a_runs_timeline(
    page: Page, conn: Conn, make_token: MakeToken
) -> None:
    arguments = {"title": "invoice_\u202efdp.exe", "priority": "low"}
    approval = run_awaiting_approval(conn, arguments=arguments)
    sign_in(page, make_token("approver", name="ana@example.com"))
    page.locator(f'tr[data-run-id="{approval.run_id}"] a.run-link').click()
    entry = page.locator(f'li.entry[data-approval-id="{approval.id}"]')
    # The bidi override is shown as an escape: it cannot reorder the name on screen.
    expect(entry.locator(".facts")).to_contain_text("Open ticket invoice_\\u202efdp.exe")
    assert "\u202e" not in page.content()

    entry.locator("button.approve").click()
    expect(page.locator("#notice")).to_have_text("approved: write_ticket by ana@example.com")
    decided = page.locator('li.entry[data-kind="approval"]')
    expect(decided.locator(".status")).to_have_text("approved")
    expect(decided.locator(".facts")).to_contain_text("by ana@example.com")
    found = approval_get(conn, approval.id)
    assert found is not None
    assert found.status is ApprovalStatus.APPROVED


def test_a_viewer_may_not_approve_and_is_told_why(
    page: Page, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn)
    sign_in(page, make_token("viewer"))
    page.goto(f"/console#/runs/{approval.run_id}")
    page.locator(f'li.entry[data-approval-id="{approval.id}"] button.approve').click()
    expect(page.locator("#error")).to_contain_text("403 forbidden: deciding approval")
    found = approval_get(conn, approval.id)
    assert found is not None
    assert found.status is ApprovalStatus.PENDING


def test_a_long_run_renders_in_chunks_and_a_large_result_is_cut(
    page: Page, conn: Conn, make_token: MakeToken
) -> None:
    run = run_awaiting_approval(conn)
    # 999 more events (the timeline shows 1,000 of the 1,002 and says so), one of 1 MB.
    conn.execute(
        "INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, "
        "payload) SELECT %s, %s, 100 + g, CASE WHEN g = 500 THEN 'big' ELSE 'note' END, "
        "jsonb_build_object('n', g, 'blob', "
        "CASE WHEN g = 500 THEN repeat('x', 1000000) ELSE '' END) "
        "FROM generate_series(1, 999) AS g",
        (run.run_id, run.tenant_id),
    )
    sign_in(page, make_token("viewer"))
    page.goto(f"/console#/runs/{run.run_id}")
    expect(page.locator("#truncated")).to_be_visible()
    expect(page.locator("li.entry")).to_have_count(200)
    more = page.locator("#more")
    for shown in (400, 600, 800, 1000):
        more.click()
        expect(page.locator("li.entry")).to_have_count(shown)
    expect(more).to_have_text("Show 1 more of 1")  # 1,000 events and the approval
    more.click()
    expect(page.locator("li.entry")).to_have_count(1001)
    expect(more).to_be_hidden()
    big = page.locator('li.entry[data-name="big"]')
    big.locator("summary").click()
    expect(big.locator("button.show-all")).to_be_visible()
    shown_json = big.locator("pre.detail").text_content() or ""
    assert shown_json.startswith('{\n  "sequence": 600,\n  "payload": {\n')
    assert len(shown_json) == 20000
