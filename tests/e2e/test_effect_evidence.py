"""GET /v1/effects: evidence (whole delivery requests) only for operators and viewers, and then
with its secrets hidden."""

from __future__ import annotations

import json

import httpx
import pytest
from psycopg.types.json import Jsonb

from ledgerloop.db.connect import Conn
from tests.e2e.conftest import MakeToken, bearer, parked_effect

pytestmark = pytest.mark.e2e

SECRET = "sk-live-0123456789abcdef"


def _with_evidence(conn: Conn) -> str:
    effect = parked_effect(conn)
    evidence = {
        "reason": "no lookup",
        "last_error": f"401 from downstream for 'Authorization: Bearer {SECRET}'",
        "request": {
            "path": "/tickets",
            "headers": {
                "Authorization": f"Bearer {SECRET}",
                "Cookie": f"session={SECRET}",
                "X-Api-Key": SECRET,
                "Idempotency-Key": effect.key,
            },
            "body": {"title": "Disk full", "password": SECRET, "nested": [{"token": SECRET}]},
        },
    }
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET evidence = %s WHERE idempotency_key = %s",
        (Jsonb(evidence), effect.key),
    )
    return effect.key


@pytest.mark.parametrize("roles", [("operator",), ("viewer",)])
def test_operators_and_viewers_see_redacted_evidence(
    http: httpx.Client, conn: Conn, make_token: MakeToken, roles: tuple[str, ...]
) -> None:
    key = _with_evidence(conn)
    response = http.get("/v1/effects", headers=bearer(make_token(*roles)))
    assert response.status_code == 200, response.text
    assert SECRET not in response.text
    (effect,) = [e for e in response.json()["effects"] if e["key"] == key]
    request = effect["evidence"]["request"]
    assert request["headers"]["Authorization"] == "[hidden]"
    assert request["headers"]["Cookie"] == "[hidden]"
    assert request["headers"]["X-Api-Key"] == "[hidden]"
    assert request["headers"]["Idempotency-Key"] == key  # not a secret: still shown
    assert request["body"]["title"] == "Disk full"
    assert request["body"]["password"] == "[hidden]"
    assert request["body"]["nested"] == [{"token": "[hidden]"}]
    assert "Bearer [hidden]" in effect["evidence"]["last_error"]


def test_other_roles_see_no_evidence(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    key = _with_evidence(conn)
    response = http.get("/v1/effects", headers=bearer(make_token("runner", "approver")))
    assert response.status_code == 200, response.text
    assert SECRET not in response.text
    (effect,) = [e for e in response.json()["effects"] if e["key"] == key]
    assert effect["evidence"] is None
    assert effect["status"] == "needs_human"  # the rest of the record is still there
    # The stored evidence is untouched: redaction is in what the API shows.
    row = conn.execute(
        "SELECT evidence FROM ledgerloop.activity_effect WHERE idempotency_key = %s", (key,)
    ).fetchone()
    assert row is not None
    assert SECRET in json.dumps(row["evidence"])
