"""Principals on a real Postgres: tokens authenticate, fail alike, and are never stored."""

from __future__ import annotations

import hashlib
import uuid

import psycopg
import pytest

from ledgerloop.approvals import (
    InvalidApprovalInput,
    Unauthenticated,
    principal_authenticate,
    principal_create,
    principal_get,
    principal_list,
    principal_revoke,
)
from ledgerloop.approvals.principals import parse_token
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, tenant_scope


def test_created_token_authenticates_as_its_principal(conn: Conn) -> None:
    tenant = uuid.uuid4()
    created, token = principal_create(
        conn, name="alice@example.com", roles=["approver", "viewer"], tenant_id=tenant
    )
    principal = principal_authenticate(conn, token)
    assert principal == created
    assert (principal.name, principal.roles, principal.tenant_id) == (
        "alice@example.com",
        ("approver", "viewer"),
        tenant,
    )
    assert principal.revoked_at is None
    assert principal_get(conn, created.id) == created


def _refusals(conn: Conn, token: str) -> list[str]:
    pid, secret = parse_token(token) or (None, "")
    assert pid is not None
    wrong_secret = f"llt_{pid.hex}_{'x' * 43}"
    unknown_id = f"llt_{uuid.uuid4().hex}_{secret}"
    messages = []
    for attempt in (wrong_secret, unknown_id, token[:-1], token + "x", "", "llt_", token.upper()):
        with pytest.raises(Unauthenticated) as info:
            principal_authenticate(conn, attempt)
        assert secret not in str(info.value)
        messages.append(str(info.value))
    return messages


def test_wrong_unknown_and_malformed_tokens_fail_alike(conn: Conn) -> None:
    _, token = principal_create(conn, name="alice", roles=["approver"])
    messages = _refusals(conn, token)
    assert len(set(messages)) == 1
    assert principal_authenticate(conn, token)  # the real one still works


def test_revoked_token_fails_with_the_same_message(conn: Conn) -> None:
    principal, token = principal_create(conn, name="alice", roles=["approver"])
    with pytest.raises(Unauthenticated) as wrong:
        principal_authenticate(conn, token[:-1] + ("a" if token[-1] != "a" else "b"))
    assert principal_revoke(conn, principal.id) is True
    assert principal_revoke(conn, principal.id) is False  # already revoked
    with pytest.raises(Unauthenticated) as revoked:
        principal_authenticate(conn, token)
    assert str(revoked.value) == str(wrong.value)
    assert principal_list(conn) == []
    [listed] = principal_list(conn, include_revoked=True)
    assert listed.id == principal.id
    assert listed.revoked_at is not None


def test_only_the_hash_of_the_secret_is_stored(conn: Conn) -> None:
    principal, token = principal_create(conn, name="alice", roles=["approver"])
    parsed = parse_token(token)
    assert parsed is not None
    _, secret = parsed
    row = conn.execute(
        "SELECT token_hash FROM ledgerloop.principal WHERE id = %s", (principal.id,)
    ).fetchone()
    assert row == {"token_hash": hashlib.sha256(secret.encode()).hexdigest()}
    tables = conn.execute(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema IN ('ledgerloop', 'dbos') AND table_type = 'BASE TABLE'"
    ).fetchall()
    for t in tables:
        dump = conn.execute(
            psycopg.sql.SQL("SELECT coalesce(string_agg(x::text, ''), '') AS d FROM {} x").format(
                psycopg.sql.Identifier(t["table_schema"], t["table_name"])
            )
        ).fetchone()
        assert dump is not None
        assert secret not in dump["d"], t
        assert token not in dump["d"], t
    assert "token" not in repr(principal).replace("token_id", "")


def test_tenant_role_cannot_read_principals(conn: Conn) -> None:
    principal_create(conn, name="alice", roles=["approver"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege), tenant_scope(conn, DEFAULT_TENANT):
        conn.execute("SELECT name FROM ledgerloop.principal")


def test_list_by_tenant(conn: Conn) -> None:
    tenant = uuid.uuid4()
    mine, _ = principal_create(conn, name="a", roles=["viewer"], tenant_id=tenant)
    principal_create(conn, name="b", roles=["viewer"])
    assert [p.id for p in principal_list(conn, tenant_id=tenant)] == [mine.id]
    assert len(principal_list(conn)) == 2


@pytest.mark.parametrize(
    ("name", "roles"),
    [("", ["approver"]), ("   ", ["approver"]), ("x", []), ("x", ["has space"]), ("x", ["a,b"])],
)
def test_invalid_name_or_roles_are_refused(conn: Conn, name: str, roles: list[str]) -> None:
    with pytest.raises(InvalidApprovalInput):
        principal_create(conn, name=name, roles=roles)
    assert principal_list(conn, include_revoked=True) == []


def test_a_bare_string_is_one_role(conn: Conn) -> None:
    principal, _ = principal_create(conn, name="x", roles="approver")
    assert principal.roles == ("approver",)
