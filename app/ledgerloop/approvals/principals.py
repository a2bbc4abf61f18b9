"""Principals: who may act through the API, the page or the CLI, and the tokens that prove it.

A token is `llt_<principal id, 32 hex>_<secret, 32 random bytes url-safe>`. The database keeps
only sha256(secret); the token is shown once, at creation. The id in the token makes the lookup
a primary-key read, and the secret is compared in constant time, so response times say nothing
about how much of a guessed secret was right.

Principals are read without tenant scope (authentication comes before scoping) by the owner
role; the tenant role has no grant on the table at all.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ledgerloop.approvals.errors import InvalidApprovalInput, Unauthenticated
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.approvals")

#: Role conventions. Roles are free strings; policies name the ones an action requires.
APPROVER = "approver"  # decides approvals (the default required role)
OPERATOR = "operator"  # resolves parked (needs_human) effects
RUNNER = "runner"  # starts and cancels runs
VIEWER = "viewer"  # reads runs, timelines and approvals

TOKEN_PREFIX = "llt_"  # noqa: S105 (a prefix, not a secret)
_SECRET_BYTES = 32
# token_urlsafe(32) is 43 characters of the url-safe base64 alphabet, never padded.
_TOKEN_RE = re.compile(r"llt_([0-9a-f]{32})_([A-Za-z0-9_-]{43})")
# Free strings, but no whitespace or commas, so a CLI can take them as one list.
_ROLE_RE = re.compile(r"[^\s,]{1,64}")
# Compared against when the id is unknown, so that path costs the same hash and compare.
_UNKNOWN_HASH = hashlib.sha256(b"ledgerloop: no such principal").hexdigest()


@dataclass(frozen=True)
class Principal:
    """An authenticated identity. Never carries the token or its hash."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    roles: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    @property
    def token_id(self) -> uuid.UUID:
        """The id embedded in the principal's token (one token per principal)."""
        return self.id

    def role_for(self, required: Iterable[str]) -> str | None:
        """The first of `required` this principal holds, or None."""
        return next((role for role in required if role in self.roles), None)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Principal:
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            name=row["name"],
            roles=tuple(row["roles"]),
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


def hash_secret(secret: str) -> str:
    """What the database stores for a token: sha256 hex of its secret part."""
    return hashlib.sha256(secret.encode()).hexdigest()


def mint_token(principal_id: uuid.UUID) -> tuple[str, str]:
    """A fresh token for `principal_id` and the hash to store for it."""
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    return f"{TOKEN_PREFIX}{principal_id.hex}_{secret}", hash_secret(secret)


def parse_token(token: str) -> tuple[uuid.UUID, str] | None:
    """(principal id, secret) of a well-formed token, else None."""
    match = _TOKEN_RE.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        return None
    return uuid.UUID(hex=match.group(1)), match.group(2)


def _check_roles(roles: Iterable[str]) -> tuple[str, ...]:
    # A bare string is one role, not a list of one-letter roles.
    checked = (roles,) if isinstance(roles, str) else tuple(dict.fromkeys(roles))
    bad = [role for role in checked if not isinstance(role, str) or not _ROLE_RE.fullmatch(role)]
    if not checked or bad:
        raise InvalidApprovalInput(
            f"roles must be a non-empty list of names (1-64 characters, no spaces or commas), "
            f"got {list(checked)!r}",
            fix=f"use e.g. {APPROVER!r}, {OPERATOR!r}, {RUNNER!r} or {VIEWER!r}",
        )
    return checked


def principal_create(
    conn: Conn, *, name: str, roles: Iterable[str], tenant_id: uuid.UUID = DEFAULT_TENANT
) -> tuple[Principal, str]:
    """Create a principal and return it with its token. The token is not stored: show it once."""
    if not name or not name.strip():
        raise InvalidApprovalInput("a principal needs a name", fix="pass e.g. the person's email")
    checked = _check_roles(roles)
    principal_id = uuid.uuid4()
    token, token_hash = mint_token(principal_id)
    row = conn.execute(
        Q["principal_insert"],
        {
            "id": principal_id,
            "tenant_id": tenant_id,
            "name": name.strip(),
            "roles": list(checked),
            "token_hash": token_hash,
        },
    ).fetchone()
    assert row is not None
    return Principal.from_row(row), token


def principal_authenticate(conn: Conn, token: str) -> Principal:
    """The active principal `token` belongs to; Unauthenticated otherwise (one message for all)."""
    parsed = parse_token(token)
    row = (
        conn.execute(Q["principal_get_for_auth"], {"id": parsed[0]}).fetchone() if parsed else None
    )
    stored = row["token_hash"] if row else _UNKNOWN_HASH
    secret = parsed[1] if parsed else ""
    matches = hmac.compare_digest(hash_secret(secret).encode(), str(stored).encode())
    if row is None or not matches or row["revoked_at"] is not None:
        raise Unauthenticated()
    return Principal.from_row(row)


def principal_revoke(conn: Conn, principal_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """Revoke the principal's token. Returns False when it was already revoked or unknown.

    Decisions in flight finish first (they hold the principal row FOR SHARE); none starts after.
    """
    row = conn.execute(Q["principal_revoke"], {"id": principal_id, "now": now}).fetchone()
    return row is not None


def principal_get(conn: Conn, principal_id: uuid.UUID) -> Principal | None:
    row = conn.execute(Q["principal_get"], {"id": principal_id}).fetchone()
    return Principal.from_row(row) if row else None


def principal_list(
    conn: Conn, *, tenant_id: uuid.UUID | None = None, include_revoked: bool = False
) -> list[Principal]:
    rows = conn.execute(
        Q["principal_list"], {"tenant_id": tenant_id, "include_revoked": include_revoked}
    ).fetchall()
    return [Principal.from_row(row) for row in rows]


def principal_lock(conn: Conn, principal_id: uuid.UUID) -> Principal:
    """Re-read an authenticated principal inside the caller's transaction, FOR SHARE.

    Decisions trust the database, not the Principal object they were handed: a token revoked
    or a role removed since authentication counts.
    """
    row = conn.execute(Q["principal_lock"], {"id": principal_id}).fetchone()
    if row is None or row["revoked_at"] is not None:
        raise Unauthenticated()
    return Principal.from_row(row)
