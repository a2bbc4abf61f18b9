"""Retention: how fast `ledgerloop runs purge` deletes finished runs, and how long it locks.

Template runs are real: the ops agent's demo (a knowledge-base search, a ticket approved by a
person, the effect delivered by the relay to the ticket service, a final answer), run to the
end by a worker. Each is then copied in bulk, in both schemas, under new ids, into two sets
of N runs (BENCH_PURGE_RUNS, default 10,000 each):

- baseline: the bare deletes a purge cannot do with less (DBOS's `delete_workflows` and one
  `DELETE FROM agent_run` per batch of 500), without any of the purge's checks;
- purge: `purge_finished`, checks included (unsettled effects, active workflows), adaptive
  batches. Its longest transaction is the longest any lock is held.

Targets: >= 2,000 runs/s; no transaction (so no lock) longer than 1 s.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.control.timeline import dbos_client
from ledgerloop.db.connect import Conn, connect
from ledgerloop.retention.purge import PurgeClient, PurgeOptions, purge_finished
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.worker import WorkerThread
from ledgerloop.worker import WorkerOptions
from scripts.benchmarks import results
from scripts.benchmarks.common import database, report, scripted, settings_for
from scripts.benchmarks.effects import ticket_service

N = int(results.size("BENCH_PURGE_RUNS", "10000", "50"))
#: Newer finished runs that stay (a purge removes the oldest slice of a larger history).
KEPT = int(os.environ.get("BENCH_PURGE_KEPT", str(3 * N)))
TEMPLATES = 25
BATCH = 500

# table -> (the column naming the run, columns rewritten for the copy: old id -> new id)
COPIED: dict[str, tuple[str, dict[str, str]]] = {
    "ledgerloop.agent_run": ("id", {"id": "m.new_id", "idempotency_key": "NULL"}),
    "ledgerloop.agent_run_event": ("run_id", {"run_id": "m.new_id"}),
    "ledgerloop.agent_message_batch": (
        "run_id",
        {"run_id": "m.new_id", "conversation_id": "replace(t.conversation_id, m.old, m.new)"},
    ),
    "ledgerloop.approval": ("run_id", {"run_id": "m.new_id", "id": "gen_random_uuid()"}),
    "ledgerloop.activity_effect": (
        "run_id",
        {"run_id": "m.new_id", "idempotency_key": "replace(t.idempotency_key, m.old, m.new)"},
    ),
    "dbos.workflow_status": (
        "workflow_uuid",
        {"workflow_uuid": "m.new", "deduplication_id": "NULL"},
    ),
    "dbos.workflow_input": ("workflow_uuid", {"workflow_uuid": "m.new"}),
    "dbos.workflow_output": ("workflow_uuid", {"workflow_uuid": "m.new"}),
    "dbos.operation_outputs": ("workflow_uuid", {"workflow_uuid": "m.new"}),
    "dbos.notifications": (
        "destination_uuid",
        {"destination_uuid": "m.new", "message_uuid": "gen_random_uuid()::text"},
    ),
}


def _columns(conn: Conn, table: str) -> list[str]:
    schema, name = table.split(".")
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = %s AND column_default IS DISTINCT FROM "
        "'nextval(''ledgerloop.outbox_id_seq''::regclass)' ORDER BY ordinal_position",
        (schema, name),
    ).fetchall()
    return [row["column_name"] for row in rows]


def _insert_copy(
    table: str, cols: list[str], rewrite: dict[str, str], join_on: sql.Composable
) -> sql.Composed:
    # Benchmark set-up only: the table names and expressions are this module's constants.
    schema, name = table.split(".")
    exprs = [
        sql.SQL(rewrite[c]) if c in rewrite else sql.SQL("t.{}").format(sql.Identifier(c))
        for c in cols
    ]
    return sql.SQL(
        "INSERT INTO {table} ({cols}) SELECT {exprs} FROM {table} t JOIN m ON {on}"
    ).format(
        table=sql.Identifier(schema, name),
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in cols),
        exprs=sql.SQL(", ").join(exprs),
        on=join_on,
    )


def _copy(conn: Conn, templates: list[uuid.UUID], copies: int) -> list[uuid.UUID]:
    """`copies` copies of each template run, in both schemas; returns the new ids."""
    conn.execute(
        "CREATE TEMP TABLE m AS SELECT old_id, old_id::text AS old, new_id, "
        "new_id::text AS new FROM (SELECT t.id AS old_id, gen_random_uuid() AS new_id "
        "FROM unnest(%s::uuid[]) AS t(id) CROSS JOIN generate_series(1, %s)) copies",
        (templates, copies),
    )
    with conn.transaction():
        for table, (key, rewrite) in COPIED.items():
            cols = _columns(conn, table)
            join = "m.old_id" if table.startswith("ledgerloop") else "m.old"
            conn.execute(
                _insert_copy(
                    table, cols, rewrite, sql.SQL("t.{} = " + join).format(sql.Identifier(key))
                )
            )
        cols = [c for c in _columns(conn, "ledgerloop.outbox") if c != "id"]
        conn.execute(
            _insert_copy(
                "ledgerloop.outbox",
                cols,
                {"idempotency_key": "replace(t.idempotency_key, m.old, m.new)"},
                sql.SQL("t.idempotency_key LIKE m.old || ':%'"),
            )
        )
    ids = [row["new_id"] for row in conn.execute("SELECT new_id FROM m").fetchall()]
    conn.execute("DROP TABLE m")
    conn.execute("ANALYZE")
    return ids


def _bytes(conn: Conn) -> int:
    row = conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid))::bigint AS b FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname IN ('ledgerloop', 'dbos') AND c.relkind = 'r'"
    ).fetchone()
    assert row is not None
    return int(row["b"])


def _template_runs(url: str, model_url: str, tickets_url: str) -> list[uuid.UUID]:
    settings = settings_for(url, model_url, destinations={"tickets": tickets_url})
    from ledgerloop.services import build_services

    options = WorkerOptions(services=build_services(settings, http=False, relay=True))
    with WorkerThread(settings, url, options), connect(url, autocommit=True) as conn:
        approver, _ = principal_create(conn, name="bench", roles=["approver"])
        ids = [
            start_run(conn, agent="ops", input={"message": f"disk {i}"}) for i in range(TEMPLATES)
        ]
        decided: set[uuid.UUID] = set()

        def all_decided() -> bool:
            for approval in approval_list(conn, status="pending", limit=1000):
                approval_decide(
                    conn, approval_id=approval.id, principal=approver, decision="approve"
                )
                decided.add(approval.run_id)
            return len(decided) == len(ids)

        wait_until(all_decided, timeout=300, interval=0.1)
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) AS n FROM dbos.workflow_status WHERE status = 'SUCCESS'"
                ).fetchone()["n"]  # type: ignore[index]
                == len(ids)
            ),
            timeout=300,
            interval=0.1,
        )
    return ids


#: The bare delete of runs: the cascade, and their events (which carry no foreign key).
DELETE_RUNS = """
WITH gone AS (DELETE FROM ledgerloop.agent_run WHERE id = ANY(%(ids)s) RETURNING id)
DELETE FROM ledgerloop.agent_run_event e USING gone WHERE e.run_id = gone.id
"""


def _baseline(conn: Conn, client: Any, ids: list[uuid.UUID]) -> tuple[float, float]:
    longest = 0.0
    began = time.monotonic()
    for i in range(0, len(ids), BATCH):
        batch = ids[i : i + BATCH]
        t = time.monotonic()
        client.delete_workflows([str(x) for x in batch])
        longest = max(longest, time.monotonic() - t)
        t = time.monotonic()
        conn.execute(DELETE_RUNS, {"ids": batch})
        longest = max(longest, time.monotonic() - t)
    return len(ids) / (time.monotonic() - began), longest


def main() -> None:
    with (
        database() as url,
        scripted(_script()) as model,
    ):
        proc, tickets_url = ticket_service()
        try:
            templates = _template_runs(url, model.url, tickets_url)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        with connect(url, autocommit=True) as conn:
            copies = N // len(templates)
            baseline_ids = _copy(conn, templates, copies)
            size = _bytes(conn)
            purge_ids = _copy(conn, templates, copies)
            per_run_kb = (_bytes(conn) - size) / len(purge_ids) / 1024
            kept = _copy(conn, templates, KEPT // len(templates))
            client = dbos_client(url)
            try:
                base_rate, base_longest = _baseline(conn, client, baseline_ids)
                # As autovacuum would between two passes: the purge does not scan the
                # baseline's dead rows.
                conn.execute("VACUUM ANALYZE")
                cutoff = datetime.now(UTC)
                conn.execute(
                    "UPDATE ledgerloop.agent_run SET updated_at = now() WHERE id = ANY(%s)",
                    (kept,),
                )
                # Keep the templates themselves out of the timed purge.
                conn.execute(DELETE_RUNS, {"ids": templates})
                client.delete_workflows([str(x) for x in templates])
                purger = PurgeClient(url)
                try:
                    result = purge_finished(
                        conn, purger.dbos, cutoff, PurgeOptions(batch_size=BATCH)
                    )
                finally:
                    purger.close()
            finally:
                client.destroy()
            left = conn.execute(
                "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE id = ANY(%s)", (purge_ids,)
            ).fetchone()
            stayed = conn.execute(
                "SELECT count(*) AS n FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
                ([str(x) for x in kept],),
            ).fetchone()
    rate = result.runs / result.elapsed_s
    report(
        f"purge of {len(purge_ids)} finished runs among {len(purge_ids) + len(kept)} "
        f"({per_run_kb:.1f} KB each across both schemas, indexes included)",
        [
            ("baseline: bare deletes, batches of 500 (runs/s)", base_rate, "baseline"),
            ("baseline: longest transaction (s)", base_longest, ""),
            (
                "purge_finished (runs/s)",
                rate,
                f"{rate / base_rate:.2f}x the bare deletes (target >= 2,000/s)",
            ),
            ("purge_finished: longest transaction (s)", result.longest_txn_s, "target <= 1 s"),
            ("purge_finished: batches", float(result.batches), ""),
            ("runs left behind", float(left["n"] if left else -1), "must be 0"),
            (
                "newer runs kept",
                float(stayed["n"] if stayed else -1),
                f"must be {len(kept)}",
            ),
        ],
    )
    baseline = results.Baseline("bare deletes, batches of 500, no checks", base_rate, "runs/s")
    results.publish("purge", __doc__, baseline)


def _script() -> str:
    from ledgerloop.models.script import OPS_DEMO_SCRIPT

    return OPS_DEMO_SCRIPT.read_text()


if __name__ == "__main__":
    main()
