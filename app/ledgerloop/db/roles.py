"""The one database role Ledgerloop may need, and only for sessions that bypass row-level
security.

A tenant scope (the HTTP API, the CLI's `--tenant`) sets `ledgerloop.tenant_id` for its
transaction, and every tenant table forces a policy that then admits only that tenant's rows
(migration 0024). The policy binds every role, the tables' owner included, except superusers
and roles with BYPASSRLS: a scope entered by such a session switches, for its transaction, to
this database's scope role, `ledgerloop_scope_<database>`, which holds rights on the tenant
tables of this database alone and is never granted to an application role.

So the database owner (no superuser, no CREATEROLE) installs and runs Ledgerloop with no role
at all. `ledgerloop db upgrade` creates the scope role when its own session may create roles
and grants it its rights when it exists; `ledgerloop db roles --sql` prints what a DBA runs
once where a session that bypasses row-level security must serve tenant scopes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.db", "roles.sql")

#: The tenant tables and what a scope may do on them: the rights the HTTP API's and the
#: CLI's tenant-scoped statements use, as the tenant role of earlier releases had them.
SCOPE_TABLE_RIGHTS = {
    "agent_run": "SELECT, INSERT, UPDATE",
    "agent_run_event": "SELECT, INSERT, UPDATE",
    "agent_message": "SELECT, INSERT",
    "agent_message_batch": "SELECT",
    "payload": "SELECT, INSERT",
    "activity_effect": "SELECT, INSERT, UPDATE",
    "outbox": "SELECT, INSERT, UPDATE",
    "approval": "SELECT",
    "run_message": "SELECT, INSERT",
    # Operators list, pause, resume and trigger a tenant's schedules (migration 0029).
    "schedule": "SELECT, UPDATE",
}
#: Functions a scoped statement calls (policies read current_tenant).
SCOPE_FUNCTIONS = (
    "ledgerloop.current_tenant()",
    "ledgerloop.start_run(text, jsonb, text, uuid)",
    "ledgerloop.run_traceparent(uuid)",
)


@dataclass(frozen=True)
class ScopeState:
    name: str
    me: str
    present: bool
    bypasses: bool
    may_create: bool

    def problem(self) -> str | None:
        """What keeps this session from entering tenant scopes, or None."""
        if self.bypasses and not self.present:
            return (
                f"role {self.me} bypasses row-level security and this database's scope "
                f"role {self.name} does not exist"
            )
        return None


def scope_state(conn: Conn) -> ScopeState:
    row = conn.execute(Q["scope_state"]).fetchone()
    assert row is not None
    return ScopeState(**row)


def scope_grants_sql(name: str) -> list[str]:
    """The grants the scope role gets in this database (run by the schema's owner)."""
    quoted = _quote(name)
    statements = [f"GRANT USAGE ON SCHEMA ledgerloop TO {quoted}"]
    statements += [
        f"GRANT {rights} ON ledgerloop.{table} TO {quoted}"
        for table, rights in SCOPE_TABLE_RIGHTS.items()
    ]
    statements.append(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA ledgerloop TO {quoted}")
    statements += [f"GRANT EXECUTE ON FUNCTION {fn} TO {quoted}" for fn in SCOPE_FUNCTIONS]
    return statements


def scope_role_install(conn: Conn) -> ScopeState:
    """Create the scope role if this session may and it is missing, then grant it its rights
    in this database. Nothing needs the role unless a session bypasses row-level security."""
    state = scope_state(conn)
    with conn.transaction():
        if not state.present and state.may_create:
            conn.execute(f"CREATE ROLE {_quote(state.name)} NOLOGIN".encode())
        if state.present or state.may_create:
            for statement in scope_grants_sql(state.name):
                conn.execute(statement.encode())
    return scope_state(conn)


def roles_sql(conn: Conn, runtime_role: str | None = None) -> str:
    """What a DBA runs once, as a role that may create roles, for a database whose tenant
    scopes are served by a session that bypasses row-level security."""
    state = scope_state(conn)
    member = runtime_role or state.me
    name = _quote(state.name)
    lines = [
        "-- Ledgerloop's tenant-scope role for this database. Needed only when the role that",
        "-- runs `ledgerloop up` is a superuser or has BYPASSRLS; the database owner, without",
        "-- either, needs no role at all. Run once, then `ledgerloop db upgrade` as the owner.",
        f"CREATE ROLE {name} NOLOGIN;",
    ]
    grant = f"GRANT {name} TO {_quote(member)};"
    if runtime_role is None:
        # A superuser switches to any role; only a non-superuser with BYPASSRLS needs this.
        lines.append(f"-- If that role is not a superuser: {grant}")
    else:
        lines.append(grant)
    return "\n".join(lines) + "\n"


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
