"""The /v1 API over real HTTP (uvicorn on an ephemeral port) against a real Postgres."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_revoke
from ledgerloop.control.timeline import dbos_client
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events, run_require
from tests.e2e.conftest import (
    TENANT_B,
    MakeToken,
    bearer,
    parked_effect,
    run_awaiting_approval,
)

pytestmark = pytest.mark.e2e


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"]
    assert error["message"]
    return error


def start(http: httpx.Client, token: str, **body: Any) -> httpx.Response:
    payload = {"agent": "ops", "input": {"message": "db-1 disk full"}, **body}
    headers = bearer(token)
    if "key" in payload:
        headers["Idempotency-Key"] = payload.pop("key")
    return http.post("/v1/runs", json=payload, headers=headers)


# -- authentication and roles ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/runs"),
        ("POST", "/v1/runs"),
        ("GET", f"/v1/runs/{uuid.UUID(int=1)}/timeline"),
        ("GET", f"/v1/runs/{uuid.UUID(int=1)}/events"),
        ("GET", "/v1/approvals"),
        ("POST", f"/v1/approvals/{uuid.UUID(int=1)}/decision"),
        ("GET", "/v1/effects"),
        ("POST", "/v1/effects/k/resolve"),
    ],
)
def test_no_or_invalid_token_is_401(
    http: httpx.Client, conn: Conn, make_token: MakeToken, method: str, path: str
) -> None:
    revoked = make_token("runner", "approver", "operator")
    principal_revoke(conn, uuid.UUID(hex=revoked.split("_")[1]))
    for headers in (
        {},
        {"Authorization": "Bearer llt_garbage"},
        {"Authorization": f"Basic {revoked}"},
        bearer(revoked),
        bearer(make_token("runner")[:-2] + "xx"),
    ):
        response = http.request(method, path, headers=headers, json={})
        error = error_of(response, 401)
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert error["type"] == "unauthenticated"
        assert "llt_" not in response.text  # a token is never echoed


def test_a_missing_role_is_403(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    viewer = make_token("viewer")
    run_id = start(http, make_token("runner")).json()["id"]
    approval = run_awaiting_approval(conn)
    effect = parked_effect(conn)

    error = error_of(start(http, viewer), 403)
    assert "runner" in error["message"]
    assert "viewer" in error["message"]
    error_of(http.post(f"/v1/runs/{run_id}/cancel", headers=bearer(viewer)), 403)
    decision = {"decision": "approve"}
    response = http.post(
        f"/v1/approvals/{approval.id}/decision", json=decision, headers=bearer(viewer)
    )
    assert "approver" in error_of(response, 403)["message"]
    resolve = http.post(
        f"/v1/effects/{effect.key}/resolve",
        json={"succeeded": "T-1"},
        headers=bearer(make_token("approver")),
    )
    assert "operator" in error_of(resolve, 403)["message"]
    # Reading needs no particular role.
    assert http.get(f"/v1/runs/{run_id}", headers=bearer(viewer)).status_code == 200


def test_tenants_see_only_their_own(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    run_id = start(http, make_token("runner")).json()["id"]
    approval = run_awaiting_approval(conn)
    effect = parked_effect(conn)
    other = make_token("runner", "viewer", "approver", "operator", tenant=TENANT_B)

    # Another tenant's ids are simply not there: 404, never 403.
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/timeline"):
        assert error_of(http.get(path, headers=bearer(other)), 404)["type"] == "run_not_found"
    error_of(http.post(f"/v1/runs/{run_id}/cancel", headers=bearer(other)), 404)
    decided = http.post(
        f"/v1/approvals/{approval.id}/decision",
        json={"decision": "approve"},
        headers=bearer(other),
    )
    error_of(decided, 404)
    resolved = http.post(
        f"/v1/effects/{effect.key}/resolve", json={"failed": "no"}, headers=bearer(other)
    )
    error_of(resolved, 404)
    for path, field in (("/v1/runs", "runs"), ("/v1/approvals", "approvals")):
        assert http.get(path, headers=bearer(other)).json()[field] == []
    assert http.get("/v1/effects", headers=bearer(other)).json()["effects"] == []

    # Tenant B's own run is B's: A cannot see it either.
    b_run = start(http, other).json()
    assert b_run["tenant_id"] == str(TENANT_B)
    listed = http.get("/v1/runs", headers=bearer(make_token("viewer"))).json()["runs"]
    assert {r["id"] for r in listed} == {run_id, str(approval.run_id), str(effect.run_id)}


# -- starting runs ---------------------------------------------------------------------------


def test_start_is_idempotent_per_key(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    runner = make_token("runner")
    first = start(http, runner, key="ticket-4711", conversation_id="conv-1")
    assert first.status_code == 201, first.text
    run = first.json()
    assert run["status"] == "received"
    assert run["agent"] == "ops"
    assert run["input"] == {"message": "db-1 disk full", "conversation_id": "conv-1"}

    again = start(http, runner, key="ticket-4711", conversation_id="conv-1")
    assert again.status_code == 200
    assert again.json()["id"] == run["id"]

    changed = start(http, runner, key="ticket-4711", input={"message": "something else"})
    error = error_of(changed, 422)
    assert error["type"] == "idempotency_key_reused"
    assert "ticket-4711" in error["message"]

    # Keys are per tenant: B's same key is B's own new run.
    other = start(http, make_token("runner", tenant=TENANT_B), key="ticket-4711")
    assert other.status_code == 201
    assert other.json()["id"] != run["id"]
    rows = conn.execute(
        "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE idempotency_key = 'ticket-4711'"
    ).fetchone()
    assert rows == {"n": 2}
    # Without a key every request is a new run.
    assert start(http, runner).json()["id"] != start(http, runner).json()["id"]


def test_bad_input_is_a_clear_4xx(http: httpx.Client, make_token: MakeToken) -> None:
    auth = bearer(make_token("runner"))
    json_headers = {**auth, "Content-Type": "application/json"}

    unknown = error_of(start(http, make_token("runner"), agent="nobody"), 422)
    assert unknown["type"] == "unknown_agent"
    assert "'nobody'" in unknown["message"]
    assert "looper, ops" in unknown["message"]

    big = {"agent": "ops", "input": {"doc": "x" * (256 * 1024)}}
    assert error_of(http.post("/v1/runs", json=big, headers=auth), 413)["type"] == (
        "payload_too_large"
    )
    # Sent without a Content-Length (chunked): cut off while it streams in.
    chunks = iter([b'{"agent": "ops", "input": {"doc": "', b"x" * 300_000, b'"}}'])
    chunked = http.post("/v1/runs", content=chunks, headers=json_headers)
    assert error_of(chunked, 413)["type"] == "payload_too_large"

    form = http.post(
        "/v1/runs", content=b"agent=ops", headers={**auth, "Content-Type": "text/plain"}
    )
    assert error_of(form, 415)["type"] == "unsupported_media_type"

    malformed = http.post("/v1/runs", content=b'{"agent": "ops",', headers=json_headers)
    assert error_of(malformed, 400)["type"] == "malformed_json"

    for body, needle in (
        ({"agent": "ops", "input": {}, "extra": 1}, "extra"),
        ({"agent": "ops", "input": [1, 2]}, "input"),
        ({"agent": "ops"}, "input"),
        ({"agent": "ops", "input": {"m": "nul\u0000byte"}}, "NUL"),
        ({"agent": "ops", "input": {}, "conversation_id": "a", "x": 1}, "x"),
        ({"agent": "ops", "input": {"conversation_id": "a"}, "conversation_id": "b"}, "differs"),
    ):
        error = error_of(http.post("/v1/runs", json=body, headers=auth), 422)
        assert needle in error["message"], error
    huge_number = http.post(
        "/v1/runs", content=b'{"agent": "ops", "input": {"n": 1e999}}', headers=json_headers
    )
    assert "out of range" in error_of(huge_number, 422)["message"]
    long_key = start(http, make_token("runner"), key="k" * 300)
    assert "Idempotency-Key" in error_of(long_key, 422)["message"]

    assert error_of(http.get("/v1/runs/not-a-uuid", headers=auth), 422)["type"] == (
        "invalid_request"
    )
    assert error_of(http.get("/v1/runs?limit=0", headers=auth), 422)["type"] == "invalid_request"
    assert error_of(http.get("/v1/nothing-here"), 404)["type"] == "not_found"
    assert error_of(http.delete("/v1/runs", headers=auth), 405)["type"] == "method_not_allowed"


def test_unexpected_failures_are_a_generic_500_and_logged(
    http: httpx.Client,
    make_token: MakeToken,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("internal detail the caller must not see")

    monkeypatch.setattr("ledgerloop.http.routes_runs.run_page", broken)
    token = make_token("viewer")
    with caplog.at_level(logging.ERROR, logger="ledgerloop.http"):
        response = http.get("/v1/runs", headers=bearer(token))
    error = error_of(response, 500)
    assert error["type"] == "internal_error"
    assert "internal detail" not in response.text
    assert "internal detail the caller must not see" in caplog.text
    assert token not in caplog.text


# -- cancel and timeline ---------------------------------------------------------------------


@pytest.fixture
def dbos(db_url: str) -> Iterator[Any]:
    client = dbos_client(db_url)
    yield client
    client.destroy()


def test_cancel_stops_pending_work_once(
    http: httpx.Client, conn: Conn, make_token: MakeToken, dbos: Any
) -> None:
    runner = make_token("runner", name="ops-lead")
    approval = run_awaiting_approval(conn)

    response = http.post(
        f"/v1/runs/{approval.run_id}/cancel",
        json={"reason": "wrong ticket"},
        headers=bearer(runner),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["run"]["status"] == "cancelled"
    assert body["approvals_cancelled"] == [str(approval.id)]
    assert body["workflow_cancelled"] is True
    last = run_events(conn, approval.run_id)[-1]
    assert last.event_type == "cancelled"
    assert last.payload["reason"] == "wrong ticket"
    assert last.payload["requested_by"].startswith("ops-lead (principal ")
    # DBOS, asked through its own API, agrees: the workflow will not run on.
    assert dbos.retrieve_workflow(str(approval.run_id)).get_status().status == "CANCELLED"
    # The approval can no longer be granted.
    late = http.post(
        f"/v1/approvals/{approval.id}/decision",
        json={"decision": "approve"},
        headers=bearer(make_token("approver")),
    )
    assert "cancelled" in error_of(late, 409)["message"]

    again = http.post(f"/v1/runs/{approval.run_id}/cancel", headers=bearer(runner))
    error = error_of(again, 409)
    assert error["type"] == "run_not_cancellable"
    assert "already cancelled" in error["message"]
    assert run_require(conn, approval.run_id).status is RunStatus.CANCELLED


def test_timeline_merges_events_and_approvals_in_order(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn)
    response = http.get(
        f"/v1/runs/{approval.run_id}/timeline", headers=bearer(make_token("viewer"))
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["run"]["status"] == "awaiting_approval"
    assert body["truncated"] is False
    entries = body["entries"]
    assert [(e["kind"], e["name"]) for e in entries] == [
        ("event", "received"),
        ("event", "planning"),
        ("event", "awaiting_approval"),
        ("approval", "write_ticket"),
    ]  # no worker ran, so there are no steps
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    shown = entries[-1]
    assert shown["status"] == "pending"
    assert shown["detail"]["action_hash"] == approval.action_hash
    assert shown["detail"]["summary"] == "Open ticket Disk full on db-1"


# -- approvals -------------------------------------------------------------------------------


def test_decisions_duplicates_and_conflicts(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    approver = make_token("approver", name="ana@example.com")
    approval = run_awaiting_approval(conn)
    url = f"/v1/approvals/{approval.id}/decision"

    pending = http.get("/v1/approvals?status=pending", headers=bearer(approver)).json()
    assert [a["id"] for a in pending["approvals"]] == [str(approval.id)]
    assert pending["approvals"][0]["preview"]["summary"] == "Open ticket Disk full on db-1"

    decided = http.post(url, json={"decision": "approve", "reason": "ok"}, headers=bearer(approver))
    assert decided.status_code == 200, decided.text
    record = decided.json()
    assert record["outcome"] == "applied"
    assert record["approval"]["status"] == "approved"
    assert record["approval"]["decided_by_name"] == "ana@example.com"
    assert record["approval"]["auth_role"] == "approver"
    assert record["approval"]["action_hash"] == approval.action_hash

    again = http.post(url, json={"decision": "approve"}, headers=bearer(approver))
    assert again.status_code == 200
    assert again.json()["outcome"] == "duplicate"
    conflict = http.post(url, json={"decision": "reject"}, headers=bearer(approver))
    error = error_of(conflict, 409)
    assert error["type"] == "approval_conflict"
    assert "already approved" in error["message"]

    error_of(http.post(url, json={"decision": "maybe"}, headers=bearer(approver)), 422)
    missing = http.post(
        f"/v1/approvals/{uuid.uuid4()}/decision",
        json={"decision": "approve"},
        headers=bearer(approver),
    )
    assert error_of(missing, 404)["type"] == "approval_not_found"


def test_an_expired_approval_cannot_be_decided(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    response = http.post(
        f"/v1/approvals/{approval.id}/decision",
        json={"decision": "approve"},
        headers=bearer(make_token("approver")),
    )
    assert "expired" in error_of(response, 409)["message"]
    listed = http.get("/v1/approvals?status=expired", headers=bearer(make_token("viewer")))
    assert [a["id"] for a in listed.json()["approvals"]] == [str(approval.id)]


# -- effects ---------------------------------------------------------------------------------


def test_only_an_operator_resolves_a_parked_effect(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    effect = parked_effect(conn)
    operator = make_token("operator", name="oncall@example.com")
    url = f"/v1/effects/{effect.key}/resolve"

    parked = http.get("/v1/effects?status=needs_human", headers=bearer(make_token("viewer")))
    assert [e["key"] for e in parked.json()["effects"]] == [effect.key]

    for body in ({}, {"succeeded": "T-1", "failed": "no"}, {"succeeded": None}):
        error = error_of(http.post(url, json=body, headers=bearer(operator)), 422)
        assert "exactly one" in error["message"]
    error_of(http.post(url, json={"retry": False}, headers=bearer(operator)), 422)
    blank = http.post(url, json={"succeeded": " "}, headers=bearer(operator))
    assert "blank" in error_of(blank, 422)["message"]

    resolved = http.post(url, json={"succeeded": "T-4711"}, headers=bearer(operator))
    assert resolved.status_code == 200, resolved.text
    body = resolved.json()
    assert body["status"] == "succeeded"
    assert body["external_reference"] == "T-4711"
    assert body["resolved_by"].startswith("oncall@example.com (principal ")

    again = http.post(url, json={"failed": "changed my mind"}, headers=bearer(operator))
    assert error_of(again, 409)["type"] == "effect_not_resolvable"
    unknown = http.post(
        "/v1/effects/no:such/resolve", json={"retry": True}, headers=bearer(operator)
    )
    assert error_of(unknown, 404)["type"] == "effect_not_found"


# -- health and spec -------------------------------------------------------------------------


def test_health_and_openapi_need_no_token(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    spec = http.get("/openapi.json").json()
    assert set(spec["paths"]) == {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/timeline",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/messages",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/fork",
        "/v1/schedules",
        "/v1/schedules/{name}/pause",
        "/v1/schedules/{name}/resume",
        "/v1/schedules/{name}/trigger",
        "/v1/approvals",
        "/v1/approvals/{approval_id}/decision",
        "/v1/effects",
        "/v1/effects/{key}/resolve",
        "/healthz",
    }
    assert spec["components"]["securitySchemes"]["token"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["token"]["description"],
    }
