"""The run console (/console) in headless Chromium, driven by Playwright against a real
server and database: sign in, runs appearing, a run's timeline growing, approving from it,
and strings that try to be markup or to reorder text."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect
from psycopg.types.json import Jsonb

from ledgerloop.approvals.store import ApprovalStatus, approval_get
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.fleet.views import runs_stuck
from ledgerloop.http.app import create_app
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.pricing import ModelPrice
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require, run_transition
from ledgerloop.services import build_services
from ledgerloop.testing.worker import WorkerThread
from ledgerloop.worker import WorkerOptions
from tests.conftest import TICKET_SCRIPT, start_test_run, wait_terminal
from tests.e2e.conftest import (
    AGENTS,
    REPO,
    MakeToken,
    ServerThread,
    parked_effect,
    run_awaiting_approval,
)

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


def test_an_operator_settles_a_parked_effect(page: Page, conn: Conn, make_token: MakeToken) -> None:
    effect = parked_effect(conn)
    sign_in(page, make_token("operator", name="olga@example.com"))
    page.goto(f"/console#/runs/{effect.run_id}")
    entry = page.locator('li.entry[data-kind="effect"]')
    expect(entry.locator(".status")).to_have_text("needs_human")
    entry.locator("input.resolution").fill("the desk never filed it")
    entry.locator("button.resolve-failed").click()
    expect(page.locator("#notice")).to_have_text(f"{effect.key} is failed")
    expect(entry.locator(".status")).to_have_text("failed")
    expect(entry.locator("button.resolve-failed")).to_have_count(0)
    row = conn.execute(
        "SELECT status, resolved_by FROM ledgerloop.activity_effect WHERE idempotency_key = %s",
        (effect.key,),
    ).fetchone()
    assert row is not None
    assert row["status"] == "failed"
    assert row["resolved_by"].startswith("olga@example.com")


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
    # The server reads and sends a megabyte first: slow on a busy machine, not the point.
    expect(page.locator("#truncated")).to_be_visible(timeout=30_000)
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


PRICES = {
    "claude-haiku-4-5": ModelPrice(input_per_mtok=1.0, output_per_mtok=5.0),
    "claude-sonnet-4-6": ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0),
}


def test_a_real_run_approved_from_the_console_goes_on_live(
    browser: Browser,
    db_url: str,
    conn: Conn,
    make_token: MakeToken,
    make_settings: Callable[..., Any],
    scripted_model: Callable[[str], ScriptedModelServer],
) -> None:
    """A worker runs the ops agent on the scripted model; its write waits for a person, who
    approves it in the console and watches the run deliver it and answer."""
    model = scripted_model(TICKET_SCRIPT)
    app = create_app(db_url, agent_names=AGENTS, prices=PRICES)
    with TicketServiceThread() as tickets, ServerThread(app) as server:
        settings = make_settings(
            anthropic_base_url=model.url,
            agent_modules="tests.support.agents",
            destinations={"tickets": tickets.url},
        )
        options = WorkerOptions(services=build_services(settings, http=False, relay=True))
        worker = WorkerThread(settings, db_url, options).start()
        context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto("/console")
            sign_in(page, make_token("approver", name="ana@example.com"))
            run_id = start_test_run(conn, "ops", "db-1 disk full")
            listed = page.locator(f'tr[data-run-id="{run_id}"]')
            expect(listed.locator(".status")).to_have_text("awaiting_approval", timeout=30_000)
            page.click("#refresh")  # the counts too (the list's own refresh leaves them)
            expect(page.locator('#counts li[data-status="awaiting_approval"]')).to_have_text(
                "awaiting_approval: 1"
            )
            page.screenshot(path=DOCS / "console-list.png")
            listed.locator("a.run-link").click()

            approve = page.locator('li.entry[data-kind="approval"] button.approve')
            approve.click()
            expect(page.locator("#notice")).to_have_text(
                "approved: write_ticket by ana@example.com"
            )
            # The page follows the run as the worker delivers the write and answers.
            expect(page.locator("#run-status")).to_have_text("succeeded", timeout=30_000)
            effect = page.locator('li.entry[data-kind="effect"]')
            expect(effect.locator(".status")).to_have_text("succeeded")
            expect(effect.locator(".facts")).to_contain_text(f"tickets · key {run_id}:")
            expect(page.locator("li.turn > h2")).to_have_text(["Start", "Turn 0", "Turn 1"])
            calls = page.locator('li.entry[data-kind="step"]').filter(has_text="claude-")
            expect(calls).to_have_count(2)
            # model · tokens in · tokens out · cost · latency · stop reason · tools asked for
            expect(calls.first.locator(".facts")).to_contain_text("· $0.0")
            expect(calls.first.locator(".facts")).to_contain_text("tool_use · → write_ticket")
            expect(calls.last.locator(".facts")).to_contain_text("end_turn")
            expect(page.locator("#run-totals")).to_contain_text("2 model calls")
            expect(page.locator("#run-totals")).to_contain_text("cost $0.0")
            decided = page.locator('li.entry[data-kind="approval"]')
            expect(decided.locator(".facts")).to_contain_text("by ana@example.com")
            page.screenshot(path=DOCS / "console-detail.png", full_page=True)
            assert errors == []
        finally:
            context.close()
            worker.stop()
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
        assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 1


#: A first write, then a model call that fails the run (the scripted server answers 500 once);
#: asked again, the model makes a second write and answers.
FAILS_AFTER_A_WRITE = """
default:
  turns:
    - tool_use: {name: ticket_plain, input: {title: "first"}}
    - status: 500
      times: 1
      then:
        tool_use: {name: ticket_plain, input: {title: "second"}}
    - text: "Filed both."
"""


def test_a_failed_run_forked_from_its_last_model_call_succeeds_delivering_each_write_once(
    browser: Browser,
    db_url: str,
    conn: Conn,
    make_token: MakeToken,
    make_settings: Callable[..., Any],
    scripted_model: Callable[[str], ScriptedModelServer],
) -> None:
    model = scripted_model(FAILS_AFTER_A_WRITE)
    app = create_app(db_url, agent_names=AGENTS, prices=PRICES)
    with TicketServiceThread() as tickets, ServerThread(app) as server:
        settings = make_settings(
            anthropic_base_url=model.url,
            agent_modules="tests.support.agents",
            destinations={"tickets": tickets.url},
        )
        options = WorkerOptions(services=build_services(settings, http=False, relay=True))
        worker = WorkerThread(settings, db_url, options).start()
        context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
        try:
            run_id = start_test_run(conn, "writer", "file two tickets")
            assert wait_terminal(conn, run_id).status is RunStatus.FAILED
            assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 1
            token = make_token("runner", name="rui@example.com")
            auth = {"Authorization": f"Bearer {token}"}
            thinks = [
                e["detail"]["function_id"]
                for e in httpx.get(f"{server.url}/v1/runs/{run_id}/timeline", headers=auth).json()[
                    "entries"
                ]
                if e["kind"] == "step" and e["name"].startswith("think-")
            ]
            assert len(thinks) == 2  # think-0 wrote "first"; think-1's model call failed

            # Bad fork points are refused plainly.
            def refused(from_step: int) -> dict[str, Any]:
                answer = httpx.post(
                    f"{server.url}/v1/runs/{run_id}/fork",
                    json={"from_step": from_step},
                    headers=auth,
                )
                assert answer.status_code == 422, answer.text
                error: dict[str, Any] = answer.json()["error"]
                return error

            assert refused(999)["message"].startswith(f"run {run_id} never reached step 999")
            not_a_call = refused(1)
            assert (
                not_a_call["message"]
                == f"step 1 of run {run_id} is 'memory-load', not a model call"
            )
            assert (
                not_a_call["fix"]
                == f"fork from a think step: {thinks[0]} (think-0), {thinks[1]} (think-1)"
            )

            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"/console#/runs/{run_id}")
            sign_in(page, token)
            expect(page.locator("#run-status")).to_have_text("failed")
            last_call = page.locator('li.entry[data-name="think-1"]')
            last_call.locator("button.fork").click()
            expect(page.locator("#notice")).to_contain_text(f"forked {run_id} at step {thinks[1]}")
            expect(page.locator("#run-parent a.parent-link")).to_have_text(str(run_id))
            # The fork asks the model again, which now files the second ticket and answers.
            expect(page.locator("#run-status")).to_have_text("succeeded", timeout=30_000)
            fork_id = page.locator("#run-id").text_content()
            assert fork_id
            assert fork_id != str(run_id)
            effects = page.locator('li.entry[data-kind="effect"]')
            expect(effects).to_have_count(1)  # its own write; "first" stays the parent's
            expect(effects.locator(".facts")).to_contain_text(f"key {fork_id}:")
            assert errors == []
        finally:
            context.close()
            worker.stop()
        # One delivery per effect: the parent's "first" once (the fork did not send it
        # again), the fork's "second" once.
        assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 2
        keys = conn.execute(
            "SELECT run_id, status FROM ledgerloop.activity_effect ORDER BY created_at"
        ).fetchall()
        assert [(str(k["run_id"]), k["status"]) for k in keys] == [
            (str(run_id), "succeeded"),
            (fork_id, "succeeded"),
        ]
        # A fork's workflow names its parent in its input, as a stray second workflow of the
        # parent would; `runs stuck` must not take one for the other, should the fork's end
        # in ERROR (the test marks it so: a fork that fails ends its workflow normally).
        conn.execute(
            "UPDATE dbos.workflow_status SET status = 'ERROR' WHERE workflow_uuid = %s",
            (fork_id,),
        )
        assert [s.problem for s in runs_stuck(conn, stale_after_s=5)] == []
