"""POST /v1/runs/{id}/fork refusals that need no finished run: still executing, another
tenant's, a role that may not start runs, a bad body. (A fork that runs, and the refusals
of a bad fork point, are in test_console_page.py, on a real worker's run.)"""

from __future__ import annotations

import httpx
import pytest

from ledgerloop.db.connect import Conn
from tests.e2e.conftest import TENANT_B, MakeToken, bearer, run_awaiting_approval

pytestmark = pytest.mark.e2e


def test_forks_that_cannot_be(http: httpx.Client, conn: Conn, make_token: MakeToken) -> None:
    waiting = run_awaiting_approval(conn)
    runner = bearer(make_token("runner"))
    path = f"/v1/runs/{waiting.run_id}/fork"

    still = http.post(path, json={"from_step": 2}, headers=runner)
    assert still.status_code == 409
    assert still.json()["error"] == {
        "type": "run_still_executing",
        "message": f"run {waiting.run_id} is awaiting_approval: only a finished run can be forked",
        "fix": "wait for it to finish, or cancel it first",
    }

    other = http.post(
        path, json={"from_step": 2}, headers=bearer(make_token("runner", tenant=TENANT_B))
    )
    assert other.status_code == 404
    assert other.json()["error"]["message"] == f"no run {waiting.run_id}"

    viewer = http.post(path, json={"from_step": 2}, headers=bearer(make_token("viewer")))
    assert viewer.status_code == 403

    for body in ({"from_step": 0}, {}, {"from_step": 2, "model": "other"}):
        assert http.post(path, json=body, headers=runner).status_code == 422, body
