"""What an approver reads: readable, bounded, and free of secrets, also once stored."""

from __future__ import annotations

import json

import pytest

from ledgerloop.approvals import approval_get, approval_request, render_preview
from ledgerloop.approvals.preview import MAX_VALUE_CHARS, looks_secret
from ledgerloop.db.connect import Conn
from ledgerloop.runs.store import run_create


def test_preview_has_tool_summary_and_lines() -> None:
    preview = render_preview(
        "close_ticket", {"ticket_id": 4711, "note": "done", "tags": ["a", "b"]}, {"version": "p3"}
    )
    assert preview["tool"] == "close_ticket"
    assert preview["summary"] == 'close_ticket(ticket_id=4711, note=done, tags=["a", "b"])'
    assert preview["lines"] == ["ticket_id: 4711", "note: done", 'tags: ["a", "b"]']
    assert preview["hidden"] == []
    assert "note" not in preview
    assert preview["policy_version"] == "p3"


def test_policy_template_makes_the_summary() -> None:
    preview = render_preview(
        "refund",
        {"amount": "12.00 EUR", "customer": "acme", "api_key": "sk-live-123"},
        {"summary": "Refund {amount} to {customer} using {api_key} for {missing}"},
    )
    assert preview["summary"] == "Refund 12.00 EUR to acme using [hidden] for {missing}"


def test_broken_template_falls_back_to_the_default_summary() -> None:
    preview = render_preview("refund", {"amount": 1}, {"summary": "Refund {0} {amount"})
    assert preview["summary"] == "refund(amount=1)"


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db_password",
        "token",
        "access_token",
        "refreshToken",
        "secret",
        "client_secret",
        "api_key",
        "apiKey",
        "X-Api-Key",
        "APIKEY",
        "Authorization",
        "private_key",
        "credentials",
        "cookie",
    ],
)
def test_secret_looking_keys(key: str) -> None:
    assert looks_secret(key)


@pytest.mark.parametrize(
    "key", ["max_tokens", "author", "keyboard", "monkey", "secretary", "passage", "title"]
)
def test_ordinary_keys(key: str) -> None:
    assert not looks_secret(key)


def test_secrets_are_dropped_at_any_depth_with_a_note() -> None:
    args = {
        "url": "https://api.example.com",
        "password": "hunter2",
        "headers": {"Authorization": "Bearer abc.def", "Accept": "json"},
        "steps": [{"token": "t-1", "name": "one"}],
    }
    preview = render_preview("call_api", args)
    text = json.dumps(preview)
    for secret in ("hunter2", "abc.def", "t-1"):
        assert secret not in text
    assert preview["hidden"] == ["password", "headers.Authorization", "steps[0].token"]
    assert "3 arguments that look like secrets are not shown" in preview["note"]
    assert "headers.Authorization" in preview["note"]
    assert 'headers: {"Accept": "json"}' in preview["lines"]


def test_long_values_are_truncated_with_a_count() -> None:
    preview = render_preview("write_doc", {"body": "x" * 5000})
    [line] = preview["lines"]
    assert line.startswith("body: " + "x" * MAX_VALUE_CHARS)
    assert line.endswith(f"… ({5000 - MAX_VALUE_CHARS} more characters)")
    assert len(preview["summary"]) < 200


def test_stored_preview_holds_no_secret(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    preview = render_preview("deploy", {"service": "api", "api_key": "sk-live-999"})
    approval = approval_request(
        conn,
        run_id=run.id,
        tenant_id=run.tenant_id,
        tool="deploy",
        tool_call_id="c1",
        action_hash="h",
        preview=preview,
        policy_version="p1",
    )
    stored = approval_get(conn, approval.id)
    assert stored is not None
    assert stored.preview == preview
    row = conn.execute("SELECT preview::text AS p FROM ledgerloop.approval").fetchone()
    assert row is not None
    assert "sk-live-999" not in row["p"]


def test_bidi_controls_and_padded_newlines_are_neutralised() -> None:
    # A right-to-left override makes "invoice_exe.pdf" read otherwise; padded newlines push the
    # rest of a value out of view, or fake a second argument.
    args = {
        "file": "invoice_\u202efdp.exe",
        "note": "ok" + "\n" * 40 + "amount: 1000000",
        "amount": 10,
        "z\u200bw": "zero\u2066width",
    }
    preview = render_preview("pay", args, {"summary": "Pay {amount} for {file}"})
    text = json.dumps(preview, ensure_ascii=False)
    for char in ("\u202e", "\u200b", "\u2066", "\n"):
        assert char not in text
    assert "invoice_\\u202efdp.exe" in preview["summary"]
    assert "note: ok\\n\\n" in "\n".join(preview["lines"])
    # Each argument on its own, its value as JSON: it begins and ends at its quotes.
    assert preview["arguments"][0] == {"name": "file", "value": '"invoice_\\u202efdp.exe"'}
    assert preview["arguments"][2] == {"name": "amount", "value": "10"}
    assert preview["arguments"][3]["name"] == "z\\u200bw"
    assert [a["name"] for a in preview["arguments"]] == ["file", "note", "amount", "z\\u200bw"]


def test_plain_text_is_left_alone() -> None:
    preview = render_preview("note", {"text": "Ünïcödé — fine, «quoted» 東京"})
    assert preview["lines"] == ["text: Ünïcödé — fine, «quoted» 東京"]
    assert preview["arguments"] == [{"name": "text", "value": '"Ünïcödé — fine, «quoted» 東京"'}]
