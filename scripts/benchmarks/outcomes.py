"""The relay's record of an outcome, with thousands of other effects in flight.

Each measured outcome is the relay's own statement (`outbox_record`, one outcome at a time,
on an autocommit connection as the relay records) for an effect recorded claimed the way an
act step records it. Baseline, in the same run and right before each case: the same record
with no other effect in flight. Then BENCH_OUTCOMES_IN_FLIGHT (5,000 and 20,000) other
effects wait `started` (a slow destination, or a backlog of outcomes the reconciler has yet
to settle), with statistics taken after they were added ("fresh") and before ("stale": the
planner believes almost none are in flight, as right after a burst). Target: each within
1.5x its baseline, since an outcome touches one effect whatever else is in flight.
BENCH_OUTCOMES_N outcomes (300) per case; medians.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

import psycopg
from psycopg.rows import dict_row

from ledgerloop.agent.effect_record import RECORD_CLAIMED, claimed_record_params
from ledgerloop.db.connect import Conn, connect
from ledgerloop.effects.hashing import idempotency_key
from ledgerloop.effects.ledger import Claim, Effect
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import Claimed, Outcome, outbox_record
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status
from scripts.benchmarks.common import database, report
from scripts.benchmarks.results import Baseline, publish, size

N = int(size("BENCH_OUTCOMES_N", "300", "3"))
IN_FLIGHT = [int(n) for n in size("BENCH_OUTCOMES_IN_FLIGHT", "5000,20000", "20").split(",")]
TENANT = uuid.UUID(int=0)
REQUEST = DeliveryRequest(path="/idempotent/tickets", body={"title": "t"}, honours_idempotency=True)


def _claimed(conn: Conn, n: int) -> list[Claimed]:
    """`n` runs, each with one write recorded claimed (agent.effect_record's statement)."""
    out = []
    for _ in range(n):
        run_id = start_run(conn, agent="ops", input={})
        run_ensure_status(conn, run_id, RunStatus.PLANNING, "planning")
        key = idempotency_key(str(run_id), "c1")
        params = claimed_record_params(
            30.0,
            step="tool-0-c1",
            payload={"tool_call_id": "c1"},
            key=key,
            run_id=run_id,
            tenant_id=TENANT,
            tool="write_ticket",
            request_hash="h",
            destination="tickets",
            request=REQUEST,
        )
        row = conn.execute(RECORD_CLAIMED, params).fetchone()
        assert row is not None
        assert row["idempotency_key"] == key, row
        effect = Effect.from_row(row)
        claim = Claim(row["outbox_id"], row["deadline_in_s"])
        out.append(Claimed.at_insert(effect, claim, REQUEST.to_json(), "think-1"))
    return out


def _in_flight(conn: Conn, n: int) -> None:
    """`n` other effects `started` under a long lease, on one run of their own."""
    run_id = start_run(conn, agent="ops", input={})
    conn.execute(
        "INSERT INTO ledgerloop.activity_effect (idempotency_key, run_id, tenant_id, tool, "
        "request_hash, destination, status, attempts, lease_until) "
        "SELECT 'in-flight-' || %s || '-' || g, %s, %s, 'write_ticket', 'h', 'tickets', "
        "'started', 1, now() + interval '1 hour' FROM generate_series(1, %s) AS g",
        (str(run_id), run_id, TENANT, n),
    )


def _settle_in_flight(conn: Conn) -> None:
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'succeeded' WHERE status = 'started'"
    )


async def _record_each(url: str, claimed: list[Claimed]) -> list[float]:
    took = []
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as aconn:
        for one in claimed:
            outcome = Outcome(one, EffectStatus.SUCCEEDED, OutboxStatus.DONE, result={"id": 1})
            start = time.perf_counter()
            owned = await outbox_record(aconn, [outcome])
            took.append((time.perf_counter() - start) * 1000)
            assert owned == {one.key}
    return took


def main() -> None:
    rows: list[tuple[str, float, str]] = []
    with database() as url, connect(url, autocommit=True) as conn:
        asyncio.run(_record_each(url, _claimed(conn, 20)))  # warm-up: connection, caches
        for n in IN_FLIGHT:
            for stats in ("stale", "fresh"):
                # The baseline right before each case: the tables have grown since the last.
                conn.execute("ANALYZE ledgerloop.activity_effect")
                base = statistics.median(asyncio.run(_record_each(url, _claimed(conn, N))))
                if stats == "stale":
                    conn.execute("ANALYZE ledgerloop.activity_effect")
                _in_flight(conn, n)
                if stats == "fresh":
                    conn.execute("ANALYZE ledgerloop.activity_effect")
                took = statistics.median(asyncio.run(_record_each(url, _claimed(conn, N))))
                rows.append((f"{n:,} in flight, {stats} statistics: none in flight", base, "ms"))
                rows.append(
                    (f"{n:,} in flight, {stats} statistics", took, f"{took / base:.2f}x (<= 1.5x)")
                )
                _settle_in_flight(conn)
    report(
        f"outcomes: the relay's record of one outcome, {N} of each, medians "
        f"({time.strftime('%Y-%m-%d %H:%M')})",
        rows,
    )
    publish("outcomes", __doc__, Baseline("the same record with nothing else in flight, each case"))


if __name__ == "__main__":
    main()
