"""Token format, parsing and hashing, without a database."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

import pytest

from ledgerloop.approvals.errors import Unauthenticated
from ledgerloop.approvals.principals import (
    Principal,
    hash_secret,
    mint_token,
    parse_token,
)


def test_minted_token_has_the_documented_shape_and_parses_back() -> None:
    pid = uuid.uuid4()
    token, stored = mint_token(pid)
    prefix, hex_id, secret = token[:4], token[4:36], token[37:]
    assert prefix == "llt_"
    assert hex_id == pid.hex
    assert token[36] == "_"
    assert len(secret) == 43  # 32 random bytes, url-safe base64 without padding
    assert parse_token(token) == (pid, secret)
    assert stored == hashlib.sha256(secret.encode()).hexdigest() == hash_secret(secret)
    assert secret not in stored


def test_tokens_are_unique_even_for_the_same_principal() -> None:
    pid = uuid.uuid4()
    tokens = {mint_token(pid)[0] for _ in range(50)}
    assert len(tokens) == 50


def test_secret_may_contain_underscores_and_dashes() -> None:
    pid = uuid.uuid4()
    secret = "_-" * 21 + "A"
    assert parse_token(f"llt_{pid.hex}_{secret}") == (pid, secret)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "llt_",
        "Bearer llt_" + "a" * 32 + "_" + "b" * 43,
        "llt_" + "a" * 32 + "_" + "b" * 43 + " ",
        "llt_" + "a" * 32 + "_" + "b" * 42,
        "llt_" + "a" * 32 + "_" + "b" * 44,
        "llt_" + "A" * 32 + "_" + "b" * 43,
        "llt_" + "a" * 31 + "_" + "b" * 44,
        "llx_" + "a" * 32 + "_" + "b" * 43,
        "llt_" + "a" * 32 + "-" + "b" * 43,
        "llt_" + "a" * 32 + "_" + "b" * 42 + "=",
        "llt_" + "a" * 32 + "_" + "b" * 42 + "\n",
    ],
)
def test_malformed_tokens_do_not_parse(token: str) -> None:
    assert parse_token(token) is None


def test_unauthenticated_is_one_message_and_401() -> None:
    first, second = Unauthenticated(), Unauthenticated()
    assert str(first) == str(second)
    assert first.status_code == 401
    assert not first.retryable
    assert "llt_" not in first.message


def test_role_for_follows_the_required_order() -> None:
    p = Principal(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        name="ops",
        roles=("viewer", "operator", "approver"),
        created_at=datetime.now(UTC),
        revoked_at=None,
    )
    assert p.role_for(("approver", "operator")) == "approver"
    assert p.role_for(("finance",)) is None
    assert p.token_id == p.id
