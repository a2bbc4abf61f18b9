"""The one mapping from errors to HTTP statuses: by attribute or type, never by message."""

from __future__ import annotations

import json

from ledgerloop.approvals.errors import ApprovalConflict, Forbidden, Unauthenticated
from ledgerloop.control.cancel import RunNotCancellable
from ledgerloop.db.errors import DatabasePrivilegeError, DatabaseUnreachable
from ledgerloop.effects.errors import EffectNotFound, KeyReuse
from ledgerloop.errors import LedgerloopError
from ledgerloop.http.errors import error_type, ledgerloop_error_response, status_for
from ledgerloop.runs.start import InvalidRunInput
from ledgerloop.runs.store import RunNotFound


def body(exc: LedgerloopError) -> tuple[int, dict[str, object], dict[str, str]]:
    response = ledgerloop_error_response(exc)
    return response.status_code, json.loads(bytes(response.body))["error"], dict(response.headers)


def test_statuses_come_from_attributes_then_types() -> None:
    assert status_for(Unauthenticated()) == 401
    assert status_for(Forbidden(("operator",), ("viewer",), "resolving")) == 403
    assert status_for(ApprovalConflict("late", state="expired")) == 409
    assert status_for(InvalidRunInput("bad")) == 422
    assert status_for(RunNotCancellable("done")) == 409
    assert status_for(RunNotFound("no run")) == 404
    assert status_for(EffectNotFound("no effect")) == 404
    assert status_for(KeyReuse("k", "a", "b")) == 409

    class SpecialNotFound(RunNotFound):
        pass

    assert status_for(SpecialNotFound("x")) == 404  # the most specific listed type wins
    assert status_for(LedgerloopError("some refusal")) == 400


def test_the_body_names_the_type_message_and_fix() -> None:
    status, error, headers = body(Unauthenticated())
    assert status == 401
    assert headers["www-authenticate"] == "Bearer"
    assert error == {
        "type": "unauthenticated",
        "message": "Invalid or revoked token.",
        "fix": "present a current token issued by `ledgerloop approvers add`",
    }
    assert error_type(RunNotCancellable()) == "run_not_cancellable"


def test_the_servers_own_problems_reveal_nothing() -> None:
    secret = DatabasePrivilegeError("CREATE on db.internal:5432/app was refused", fix="grant it")
    status, error, _ = body(secret)
    assert status == 500
    assert error["type"] == "internal_error"
    assert "db.internal" not in json.dumps(error)
    status, error, headers = body(DatabaseUnreachable("cannot reach db.internal:5432/app"))
    assert status == 503
    assert headers["retry-after"] == "5"
    assert "db.internal" not in json.dumps(error)
