"""Ledgerloop's objects on DBOS's tables: checked by the start-up check, re-created by
`ledgerloop db upgrade`.

Today those are the trigger that wakes hibernated runs (`ledgerloop_wake_hibernated` on
`dbos.notifications`), the two that wake the dispatchers when a run is queued
(`ledgerloop_run_enqueued_insert` and `_update` on `dbos.workflow_status`), and their
functions. DBOS owns schema `dbos` and migrates it itself (also from a user's own DBOS
application, at its launch): a migration that rebuilds a table would drop a trigger without a
word, and hibernated runs would then sleep until their deadline, queued runs wait for the
dispatchers' slow poll. So the objects are not left to a one-time migration: their
definitions live in dbos_objects.sql, `dbos_objects_problems` says what is missing or differs
from them, and `dbos_objects_install` (re-)creates them all. Every function here catches its
own errors: a trigger on DBOS's tables must never abort a statement that is not about a
Ledgerloop run.

The same check and install cover the functions' privileges: DBOS's migrations create their
functions executable by every role, so each upgrade takes that back (`public_functions`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.db", "dbos_objects.sql")


@dataclass(frozen=True)
class Function:
    """A trigger function of ours (schema ledgerloop, no arguments, SECURITY DEFINER)."""

    name: str
    #: The named blocks that create it (CREATE OR REPLACE) and then set its privileges.
    install: tuple[str, ...]

    @property
    def source(self) -> str:
        """The body Postgres stores (pg_proc.prosrc): the text between the dollar quotes."""
        found = re.search(r"AS \$\$(.*)\$\$\s*$", Q[self.install[0]], re.DOTALL)
        assert found, f"dbos_objects.sql: {self.install[0]} has no $$ body"
        return found.group(1)


@dataclass(frozen=True)
class Trigger:
    name: str
    table: str
    #: As Postgres prints it back (pg_get_triggerdef).
    definition: str
    #: The named blocks that drop and create it.
    install: tuple[str, ...]


FUNCTIONS = (
    Function("wake_hibernated_run", ("wake_function_create", "wake_function_revoke")),
    Function("notify_run_enqueued", ("notify_function_create", "notify_function_revoke")),
)
_ENQUEUED = (
    "FOR EACH ROW WHEN (((new.status = 'ENQUEUED'::text) AND "
    "(new.queue_name = 'ledgerloop_runs'::text))) "
    "EXECUTE FUNCTION ledgerloop.notify_run_enqueued()"
)
TRIGGERS = (
    Trigger(
        "ledgerloop_wake_hibernated",
        "dbos.notifications",
        "CREATE TRIGGER ledgerloop_wake_hibernated AFTER INSERT ON dbos.notifications "
        "FOR EACH ROW EXECUTE FUNCTION ledgerloop.wake_hibernated_run()",
        ("wake_trigger_drop", "wake_trigger_create"),
    ),
    Trigger(
        "ledgerloop_run_enqueued_insert",
        "dbos.workflow_status",
        f"CREATE TRIGGER ledgerloop_run_enqueued_insert AFTER INSERT ON dbos.workflow_status "
        f"{_ENQUEUED}",
        ("notify_insert_trigger_drop", "notify_insert_trigger_create"),
    ),
    Trigger(
        "ledgerloop_run_enqueued_update",
        "dbos.workflow_status",
        f"CREATE TRIGGER ledgerloop_run_enqueued_update AFTER UPDATE OF status ON "
        f"dbos.workflow_status {_ENQUEUED}",
        ("notify_update_trigger_drop", "notify_update_trigger_create"),
    ),
)


def dbos_objects_problems(conn: Conn) -> list[str]:
    """What of Ledgerloop's objects on DBOS's tables is missing or not current, in words."""
    problems = []
    for function in FUNCTIONS:
        label = f"function ledgerloop.{function.name}()"
        state = conn.execute(Q["function_state"], {"name": function.name}).fetchone()
        if state is None:
            problems.append(f"{label} is missing")
        elif state["source"] != function.source or not state["definer"]:
            problems.append(f"{label} differs from this release's")
    for trigger in TRIGGERS:
        label = f"trigger {trigger.name} on {trigger.table}"
        params = {"name": trigger.name, "table": trigger.table}
        found = conn.execute(Q["trigger_state"], params).fetchone()
        assert found is not None
        if not found["table_exists"]:
            problems.append(f"{trigger.table} does not exist (the DBOS schema is not installed)")
        elif found["definition"] is None:
            problems.append(f"{label} is missing")
        elif found["definition"] != trigger.definition:
            problems.append(f"{label} differs from this release's")
        elif found["enabled"] not in ("O", "A"):
            problems.append(f"{label} is disabled")
    public = [row["name"] for row in conn.execute(Q["public_functions"]).fetchall()]
    if public:
        shown = ", ".join(public[:3]) + (f" and {len(public) - 3} more" if len(public) > 3 else "")
        problems.append(f"every role may execute {shown}")
    return problems


def dbos_objects_install(conn: Conn) -> None:
    """(Re-)create every object, in one transaction (the caller's, if it has one)."""
    with conn.transaction():
        for function in FUNCTIONS:
            for block in function.install:
                conn.execute(Q[block])
        for trigger in TRIGGERS:
            for block in trigger.install:
                conn.execute(Q[block])
        conn.execute(Q["public_functions_revoke"])
