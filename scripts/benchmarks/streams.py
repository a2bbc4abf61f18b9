"""Run event streams: what the NOTIFY trigger adds to a step's status move, and what many
subscribers cost the database.

1. The run_advance statement every step makes (a status move and its event), with the
   migration 0026 trigger enabled and disabled, in alternating rounds: the ratio.
2. An HTTP app (the real one, uvicorn, on a private database) with 100 SSE subscribers on
   one run, then 1,000 across 100 runs: database connections before and after, reads the
   hub made per status move, and transactions per second while every run is idle.

3. Text deltas (scripts/benchmarks/streams_text.py): a streamed turn against the same turn
   unstreamed, and the first delta's latency from the model server to an SSE subscriber.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from typing import Any

import httpx

from ledgerloop.approvals.principals import principal_create
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, connect
from ledgerloop.http.app import create_app
from ledgerloop.http.server import listen, run_server
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status
from scripts.benchmarks.common import database, report
from scripts.benchmarks.results import Baseline, publish, smoke

MOVES = int(os.environ.get("BENCH_STREAMS_MOVES", "20" if smoke() else "400"))
ROUNDS = int(os.environ.get("BENCH_STREAMS_ROUNDS", "1" if smoke() else "5"))
#: (subscribers, runs) of each fan-out.
FAN_OUT = ((3, 1), (6, 2)) if smoke() else ((100, 1), (1000, 100))


def _moves(conn: Conn, n: int) -> float:
    """Seconds for n status moves (planning, a step's event each), as the steps make them."""
    run_id = start_run(conn, agent="ops", input={"message": "bench"}, tenant_id=DEFAULT_TENANT)
    start = time.perf_counter()
    for i in range(n):
        run_ensure_status(conn, run_id, RunStatus.PLANNING, "planning", {"turn": i}, step=f"s{i}")
    return time.perf_counter() - start


def trigger_cost(url: str) -> tuple[float, float]:
    on: list[float] = []
    off: list[float] = []
    with connect(url, autocommit=True) as conn:
        _moves(conn, 50)  # warm
        for _ in range(ROUNDS):
            for enabled, samples in ((True, on), (False, off)):
                state = "ENABLE" if enabled else "DISABLE"
                conn.execute(
                    f"ALTER TABLE ledgerloop.agent_run_event {state} TRIGGER agent_run_event_notify"
                )
                samples.append(_moves(conn, MOVES))
        conn.execute("ALTER TABLE ledgerloop.agent_run_event ENABLE TRIGGER agent_run_event_notify")
    return statistics.median(on) / MOVES * 1000, statistics.median(off) / MOVES * 1000


class Server:
    def __init__(self, url: str) -> None:
        self.app = create_app(url, agent_names={"ops"})
        self.sock = listen("127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        await run_server(self.app, self.sock, self.stop)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the HTTP app did not start")

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


def _count(conn: Conn, sql: Any) -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(next(iter(row.values())))


def _connections(conn: Conn) -> int:
    return _count(
        conn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'ledgerloop-%%'",
    )


def _xacts(conn: Conn) -> int:
    return _count(
        conn,
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()",
    )


async def _subscribe(
    client: httpx.AsyncClient, path: str, token: str, got: asyncio.Queue[str]
) -> None:
    async with client.stream("GET", path, headers={"Authorization": f"Bearer {token}"}) as r:
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                await got.put(line[7:])
                if line == "event: run.finished":
                    return


def fan_out(url: str, subscribers: int, runs: int) -> dict[str, float]:
    with connect(url, autocommit=True) as conn, Server(url) as server:
        _, token = principal_create(conn, name="bench", roles=("viewer",), tenant_id=DEFAULT_TENANT)
        ids = [
            start_run(conn, agent="ops", input={"message": "bench"}, tenant_id=DEFAULT_TENANT)
            for _ in range(runs)
        ]
        hub = server.app.state.hub

        async def main() -> dict[str, float]:
            got: asyncio.Queue[str] = asyncio.Queue()
            limits = httpx.Limits(max_connections=subscribers + 10)
            timeout = httpx.Timeout(60, read=None)
            async with httpx.AsyncClient(
                base_url=server.base, limits=limits, timeout=timeout
            ) as client:
                # One subscriber first: the listener and the pool are open from then on.
                tasks = [
                    asyncio.create_task(_subscribe(client, f"/v1/runs/{ids[0]}/events", token, got))
                ]
                await got.get()
                while hub.subscribers < 1:
                    await asyncio.sleep(0.01)
                before = await asyncio.to_thread(_connections, conn)
                tasks += [
                    asyncio.create_task(
                        _subscribe(client, f"/v1/runs/{ids[i % runs]}/events", token, got)
                    )
                    for i in range(1, subscribers)
                ]
                while hub.subscribers < subscribers:
                    await asyncio.sleep(0.05)
                after = await asyncio.to_thread(_connections, conn)
                # Idle: every subscriber waiting, no run moving.
                x0 = await asyncio.to_thread(_xacts, conn)
                await asyncio.sleep(3)
                idle_tps = (await asyncio.to_thread(_xacts, conn) - x0) / 3
                reads = hub.reads
                started = time.perf_counter()
                for run_id in ids:
                    await asyncio.to_thread(
                        run_ensure_status, conn, run_id, RunStatus.FAILED, "failed", {}
                    )
                await asyncio.gather(*tasks)
                spread = time.perf_counter() - started
            return {
                "connections_before": before,
                "connections_after": after,
                "idle_tps": idle_tps,
                "reads_per_move": (hub.reads - reads) / runs,
                "all_finished_s": spread,
            }

        return asyncio.run(main())


def main() -> None:
    with database() as url:
        on, off = trigger_cost(url)
        report(
            f"streams: a step's status move (run_advance), median of {ROUNDS} rounds",
            [
                ("with the NOTIFY trigger (ms per move)", on, ""),
                ("without it (ms per move)", off, ""),
                ("ratio", on / off, "target <= 1.05"),
            ],
        )
        for subscribers, runs in FAN_OUT:
            fig = fan_out(url, subscribers, runs)
            report(
                f"streams: {subscribers} SSE subscribers across {runs} run(s), one process",
                [
                    ("database connections with 1 subscriber", fig["connections_before"], ""),
                    (
                        f"database connections with {subscribers}",
                        fig["connections_after"],
                        "target: <= 2 more than with 1",
                    ),
                    (
                        "transactions/s while idle (whole database, bench's own included)",
                        fig["idle_tps"],
                        "",
                    ),
                    ("hub reads per status move of a run", fig["reads_per_move"], ""),
                    ("s until every subscriber saw run.finished", fig["all_finished_s"], ""),
                ],
            )
    publish("streams", __doc__, Baseline("the same status move without the trigger", off, "ms"))


if __name__ == "__main__":
    main()
