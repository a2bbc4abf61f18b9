"""GET /v1/runs: keyset pages, filters and counts by status, over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.start import start_run
from tests.e2e.conftest import TENANT_B, MakeToken, bearer

pytestmark = pytest.mark.e2e


def _fill(conn: Conn, n: int) -> None:
    """`n` runs a second apart (the newest is key-0), every third failed, agents alternating."""
    conn.execute(
        "INSERT INTO ledgerloop.agent_run (id, tenant_id, agent, status, input, idempotency_key,"
        " created_at) SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000000',"
        " CASE WHEN g %% 2 = 0 THEN 'ops' ELSE 'looper' END,"
        " CASE WHEN g %% 3 = 0 THEN 'failed' ELSE 'succeeded' END, '{}', 'key-' || g,"
        " now() - make_interval(secs => g) FROM generate_series(0, %s) AS g",
        (n - 1,),
    )


def test_pages_by_cursor_visit_every_run_once_newest_first(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    _fill(conn, 23)
    start_run(conn, agent="ops", input={}, tenant_id=TENANT_B)  # another tenant's: never shown
    auth = bearer(make_token("viewer"))
    seen: list[str] = []
    params: dict[str, str] = {"limit": "5"}
    pages = 0
    while True:
        body = http.get("/v1/runs", params=params, headers=auth).json()
        seen += [run["idempotency_key"] for run in body["runs"]]
        pages += 1
        if body["next_cursor"] is None:
            break
        params["cursor"] = body["next_cursor"]
    assert pages == 5
    assert seen == [f"key-{i}" for i in range(23)]


def test_filters_and_counts(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    _fill(conn, 12)
    auth = bearer(make_token("viewer"))

    def keys(**params: str) -> list[str]:
        body = http.get("/v1/runs", params=params, headers=auth).json()
        return [run["idempotency_key"] for run in body["runs"]]

    assert keys(status="failed") == ["key-0", "key-3", "key-6", "key-9"]
    assert keys(agent="looper", status="failed") == ["key-3", "key-9"]
    assert keys(idempotency_key="key-7") == ["key-7"]
    newest = http.get("/v1/runs", params={"limit": "3"}, headers=auth).json()["runs"]
    assert keys(created_before=newest[0]["created_at"], created_after=newest[2]["created_at"]) == [
        "key-1",
        "key-2",
    ]
    assert keys(run_id=newest[1]["id"]) == ["key-1"]
    body = http.get(
        "/v1/runs", params={"counts": "true", "agent": "ops", "status": "failed"}, headers=auth
    ).json()
    # Counts ignore the status filter (they are the tabs to switch between), not the others.
    assert body["counts"] == {"failed": 2, "succeeded": 4}
    assert http.get("/v1/runs", headers=auth).json()["counts"] is None


def test_a_cursor_not_given_out_is_refused(http: httpx.Client, make_token: MakeToken) -> None:
    response = http.get(
        "/v1/runs", params={"cursor": "bm90LWEtY3Vyc29y"}, headers=bearer(make_token("viewer"))
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["message"] == "cursor 'bm90LWEtY3Vyc29y' is not one this API gave out"
    assert "next_cursor" in error["fix"]
