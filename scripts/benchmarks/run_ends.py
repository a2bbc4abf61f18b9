"""How a bench learns that a Ledgerloop run ended: told by Postgres, or by polling.

A run ends when its `agent_run` row reaches a final status, in the run's own last commit.
The bench waits for that without spending the worker's time: a trigger it installs on its
own database (never part of Ledgerloop's schema) sends a NOTIFY from that commit, and one
listening connection resolves the waiting run. The trigger's statement carries the meter's
marker, so `Meter` leaves it out of the run's statements.

`BENCH_RUN_WAIT=poll` waits as the benches did before 2026-12-04: a `SELECT` of the run's
status every millisecond on the worker's event loop. That loop is the one the runs use, and
the poll's client and server time grow with the run's length, which inflates longer runs
against shorter ones (a write-tool turn against a read-tool turn most of all); it is kept
to reproduce the earlier figures.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Protocol

import psycopg

from ledgerloop.runs.states import TERMINAL

FINAL = tuple(sorted(status.value for status in TERMINAL))
CHANNEL = "bench_run_ended"

_TRIGGER = f"""
CREATE OR REPLACE FUNCTION public.bench_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{CHANNEL}', NEW.id::text || ' ' || NEW.status) AS bench_meter;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS bench_run_ended ON ledgerloop.agent_run;
CREATE TRIGGER bench_run_ended AFTER UPDATE OF status ON ledgerloop.agent_run
FOR EACH ROW WHEN (NEW.status IN {FINAL!r} AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION public.bench_run_ended();
"""


class RunEnds(Protocol):
    async def wait(self, run_id: str) -> str:
        """The run's final status, once it has one."""
        ...

    async def close(self) -> None: ...


class Notified:
    """Run ends as NOTIFYs from the run's last commit, read by one listening connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._ended: dict[str, str] = {}  # told before anyone waited
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, url: str) -> Notified:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await conn.execute(_TRIGGER)
        await conn.execute(f"LISTEN {CHANNEL}")
        return cls(conn)

    async def _read(self) -> None:
        try:
            async for note in self._conn.notifies():
                run_id, status = note.payload.split(" ", 1)
                waiting = self._waiting.pop(run_id, None)
                if waiting is None:
                    self._ended[run_id] = status
                elif not waiting.done():
                    waiting.set_result(status)
        except psycopg.Error as exc:
            # No run's end can be told any more: the waiting runs fail now, not never.
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(
                        RuntimeError(f"the bench's listening connection failed: {exc}")
                    )
            raise

    async def wait(self, run_id: str) -> str:
        if run_id in self._ended:
            return self._ended.pop(run_id)
        if self._reader.done():
            raise RuntimeError("the bench's listening connection is gone; run the bench again")
        waiting: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[run_id] = waiting
        return await waiting

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._conn.close()


class Polled:
    """Run ends found by a `SELECT` every millisecond (the earlier benches' way)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, url: str) -> Polled:
        return cls(await psycopg.AsyncConnection.connect(url, autocommit=True))

    async def wait(self, run_id: str) -> str:
        while True:
            cur = await self._conn.execute(
                "SELECT status AS bench_meter FROM ledgerloop.agent_run WHERE id = %s",
                (run_id,),
            )
            row = await cur.fetchone()
            if row and row[0] in FINAL:
                return str(row[0])
            await asyncio.sleep(0.001)

    async def close(self) -> None:
        await self._conn.close()


async def run_ends(url: str) -> RunEnds:
    """The way `BENCH_RUN_WAIT` names (`notify`, the default, or `poll`), open on `url`."""
    how = os.environ.get("BENCH_RUN_WAIT", "notify")
    if how == "poll":
        return await Polled.open(url)
    if how != "notify":
        raise SystemExit(f"BENCH_RUN_WAIT={how!r}: use notify (the default) or poll")
    return await Notified.open(url)
