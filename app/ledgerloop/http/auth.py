"""Who is calling: a Bearer token becomes a Principal; roles guard the routes that need one.

Reads need only a valid token (every principal may read its own tenant's data); starting and
cancelling runs need `runner`, resolving effects `operator`; an approval's own required roles
decide who may decide it (checked by the approval store, in the decision's transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ledgerloop.approvals.errors import Forbidden, Unauthenticated
from ledgerloop.approvals.principals import Principal, principal_authenticate
from ledgerloop.db.connect import Conn

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="A Ledgerloop token (`ledgerloop approvers add NAME --role ROLE` prints one).",
)


def connection(request: Request) -> Iterator[Conn]:
    """A pooled connection for this request, in autocommit: each store call or `tenant_scope`
    block is its own transaction, so a tenant scope can never outlive its block."""
    with request.app.state.pool.connection() as conn:
        conn.autocommit = True
        yield conn


Connection = Annotated[Conn, Depends(connection)]


def authenticated(
    conn: Connection,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if credentials is None:
        raise Unauthenticated()
    return principal_authenticate(conn, credentials.credentials)


Caller = Annotated[Principal, Depends(authenticated)]


def with_role(*roles: str, action: str) -> Callable[[Principal], Principal]:
    """A dependency that passes principals holding one of `roles`, else 403."""

    def check(principal: Caller) -> Principal:
        if principal.role_for(roles) is None:
            raise Forbidden(roles, principal.roles, action)
        return principal

    return check
