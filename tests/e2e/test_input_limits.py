"""One depth and size limit on a run's input, enforced alike over HTTP and SQL, before anything
is written."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.start import MAX_INPUT_DEPTH, InvalidRunInput, start_run
from tests.e2e.conftest import MakeToken, bearer

pytestmark = pytest.mark.e2e


def nested(levels: int) -> dict[str, Any]:
    """An object nesting `levels` objects and arrays in all (itself included)."""
    value: Any = {"leaf": True}
    for i in range(levels - 1):
        value = {"down": value} if i % 2 else [value]
    return value if isinstance(value, dict) else {"down": value[0]}


def _runs(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) AS n FROM ledgerloop.agent_run").fetchone()
    assert row is not None
    return int(row["n"])


def test_nested_builds_what_it_says() -> None:
    from ledgerloop.runs.start import input_too_deep

    assert not input_too_deep(nested(MAX_INPUT_DEPTH))
    assert input_too_deep(nested(MAX_INPUT_DEPTH + 1))


@pytest.mark.parametrize("levels", [MAX_INPUT_DEPTH + 1, 256])
def test_too_deep_over_http_is_422_naming_the_limit_and_no_run(
    http: httpx.Client, conn: Conn, make_token: MakeToken, levels: int
) -> None:
    runner = make_token("runner", "viewer")
    response = http.post(
        "/v1/runs",
        json={"agent": "ops", "input": nested(levels)},
        headers=bearer(runner),
    )
    assert response.status_code == 422, response.text
    assert f"more than {MAX_INPUT_DEPTH} levels deep" in response.text
    assert _runs(conn) == 0
    # Nothing half-written: the tenant's listing still answers.
    assert http.get("/v1/runs", headers=bearer(runner)).status_code == 200


def test_the_limit_itself_is_accepted_over_http_and_listed(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    runner = make_token("runner", "viewer")
    response = http.post(
        "/v1/runs",
        json={"agent": "ops", "input": nested(MAX_INPUT_DEPTH)},
        headers=bearer(runner),
    )
    assert response.status_code == 201, response.text
    listed = http.get("/v1/runs", headers=bearer(runner))
    assert listed.status_code == 200, listed.text
    run_id = response.json()["id"]
    assert http.get(f"/v1/runs/{run_id}", headers=bearer(runner)).status_code == 200
    assert http.get(f"/v1/runs/{run_id}/timeline", headers=bearer(runner)).status_code == 200


@pytest.mark.parametrize("levels", [MAX_INPUT_DEPTH + 1, 500])
def test_too_deep_over_sql_is_ll001_naming_the_limit_and_no_run(conn: Conn, levels: int) -> None:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(
            "SELECT ledgerloop.start_run('ops', %s::jsonb)",
            (psycopg.types.json.Jsonb(nested(levels)),),
        )
    assert raised.value.sqlstate == "LL001"
    message = raised.value.diag.message_primary or ""
    assert f"more than {MAX_INPUT_DEPTH} levels deep" in message
    assert _runs(conn) == 0
    with pytest.raises(InvalidRunInput, match=f"{MAX_INPUT_DEPTH}-level limit"):
        start_run(conn, agent="ops", input=nested(levels))
    assert _runs(conn) == 0


def test_the_limit_itself_is_accepted_over_sql(conn: Conn) -> None:
    start_run(conn, agent="ops", input=nested(MAX_INPUT_DEPTH))
    assert _runs(conn) == 1


def test_the_depth_check_keeps_one_plan_and_still_answers_alike(conn: Conn) -> None:
    """The check's query keeps a generic plan (migration 0023: a custom plan per execution
    cost every start_run 0.12-0.15 ms of planning), and under that plan, past the first
    executions where Postgres would still plan each one, it answers as before: at the limit
    no, one level over yes, for flat inputs and deep ones alike."""
    row = conn.execute(
        "SELECT proconfig FROM pg_proc WHERE oid = "
        "'ledgerloop.jsonb_depth_exceeds(jsonb, int)'::regprocedure"
    ).fetchone()
    assert row is not None
    assert "plan_cache_mode=force_generic_plan" in (row["proconfig"] or []), row
    check = "SELECT ledgerloop.jsonb_depth_exceeds(%s::jsonb, %s) AS over"
    cases = [
        ({"flat": 1}, False),
        (nested(MAX_INPUT_DEPTH), False),
        (nested(MAX_INPUT_DEPTH + 1), True),
        ([[[1]], {"a": [2]}], False),
    ]
    for _ in range(4):  # 16 executions of each level's query in this session
        for doc, over in cases:
            answer = conn.execute(check, (psycopg.types.json.Jsonb(doc), MAX_INPUT_DEPTH))
            assert answer.fetchone() == {"over": over}, doc
    assert conn.execute(check, (psycopg.types.json.Jsonb([[[1]]]), 2)).fetchone() == {"over": True}
