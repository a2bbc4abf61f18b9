"""Where a write-tool turn's time goes, part by part, against a read-tool turn.

`turn_write` says how a write turn compares; this says why. One worker runs, in turn and
one at a time, an answer-only run, a read-tool run and a write-tool run (the same agents,
script and ticket service as `turn_write`), plus one POST to the ticket service from the
relay's own kind of client, an INSERT + COMMIT and a `SELECT 1` (calibration: what a
durable commit and a bare round trip cost right now). Timers wrap, for the measurement only,
the parts of a write turn: the record's statement, each step's DBOS checkpoint (a write
recorded ahead rides the answer's, agent.write_ahead), the relay's `send_now` (the delivery,
up to the moment its outcome's record is under way), the transport's exchange with the
ticket service, and each `steps.think` by its place in the run (the model call; the one
that answers also saves the answer, except in a write turn, whose step saves it after; a
read turn's second one also runs its read tool; a run is over once its answer is saved,
so now and then its last one is counted with the next run's). Medians of BENCH_TURN_WRITE_PARTS_RUNS
(300) of each. Interleaving one run of each kind, rather than batches, makes every part pay
the same cold start a lone turn pays.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
import types
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import psycopg
from dbos._dbos import _get_dbos_instance

from ledgerloop.agent import steps, write_steps

try:
    from ledgerloop.agent import write_ahead
except ImportError:  # a checkout from before it
    write_ahead = None  # type: ignore[assignment]
from ledgerloop.effects import relay as relay_module
from ledgerloop.effects.transport import LeanClient, LeanTransport
from ledgerloop.runtime import Runtime
from ledgerloop.services import relay_service
from scripts.benchmarks.common import policy_file, run_in_worker, scripted, settings_for
from scripts.benchmarks.effects import ticket_service
from scripts.benchmarks.results import Baseline, Figure, publish, size
from scripts.benchmarks.run_ends import run_ends
from scripts.benchmarks.turn import _metered_cluster, _run_ledgerloop
from scripts.benchmarks.turn_write import AGENTS, POLICY, SCRIPT, TICKET

RUNS = int(size("BENCH_TURN_WRITE_PARTS_RUNS", "300", "3"))
#: How many of the statements that took the most server time to print (0: none).
STATEMENTS = int(os.environ.get("BENCH_TURN_WRITE_PARTS_STATEMENTS", "0"))

#: Milliseconds by part.
PARTS: dict[str, list[float]] = defaultdict(list)


def _timed(label: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return await fn(*args, **kwargs)
        finally:
            PARTS[label].append((time.perf_counter_ns() - start) / 1e6)

    return timed


#: The transport's own exchange, for the benchmark's POST (untimed: it is timed whole).
_EXCHANGE = LeanTransport.exchange


def _install_timers() -> None:
    # Each is looked up at call time by its callers, so replacing the attribute is enough.
    record = write_steps.record_claimed_write  # type: ignore[attr-defined]
    setattr(write_steps, "record_claimed_write", _timed("record (one statement)", record))  # noqa: B010
    ahead = getattr(write_ahead, "_Record", None)  # absent from a checkout before it
    if ahead is not None and os.environ.get("BENCH_NO_WRITE_AHEAD"):
        write_ahead._offer = lambda *args: None  # to measure what recording ahead saves
    setattr(steps, "think", _timed("steps.think", steps.think))  # noqa: B010
    send_now = _timed("relay send_now", relay_module.Relay.send_now)
    setattr(relay_module.Relay, "send_now", send_now)  # noqa: B010
    setattr(LeanTransport, "exchange", _timed("relay transport exchange", _EXCHANGE))  # noqa: B010


def _time_checkpoints(current: list[str]) -> None:
    """Time DBOS's step checkpoints (Ledgerloop's, when a rider may come with them) by step
    and by the kind of run under way (`current[0]`)."""
    sys_db = _get_dbos_instance()._sys_db
    inner = sys_db.record_operation_result

    def timed(result: Any, **kwargs: Any) -> None:
        start = time.perf_counter_ns()
        try:
            inner(result, **kwargs)
        finally:
            label = f"checkpoint {result['function_name']}, {current[0]}"
            PARTS[label].append((time.perf_counter_ns() - start) / 1e6)

    setattr(sys_db, "record_operation_result", timed)  # noqa: B010


def _untimed_transport() -> LeanTransport:
    lean = LeanTransport()
    setattr(lean, "exchange", types.MethodType(_EXCHANGE, lean))  # noqa: B010
    return lean


def main() -> None:
    _install_timers()
    proc, tickets_url = ticket_service()
    runs: dict[str, list[float]] = defaultdict(list)
    try:
        with (
            _metered_cluster() as url,
            scripted(SCRIPT) as model,
            policy_file(POLICY) as policy,
        ):
            settings = settings_for(
                url, model.url, policy_file=policy, destinations={"tickets": tickets_url}
            )

            async def body(runtime: Runtime) -> dict[str, Any]:
                current = ["warm-up"]
                _time_checkpoints(current)
                ends = await run_ends(url)
                probe = await psycopg.AsyncConnection.connect(url, autocommit=True)
                await probe.execute("CREATE TABLE bench_commit (id bigserial PRIMARY KEY)")
                client = LeanClient(_untimed_transport())

                async def run(kind: str) -> None:
                    agent = AGENTS[kind].name
                    await _run_ledgerloop(runtime, ends, 1, agent=agent, tag=kind.upper())

                async def post() -> None:
                    reply = await client.request(
                        "POST",
                        f"{tickets_url}/idempotent/tickets",
                        headers={"Idempotency-Key": str(uuid.uuid4())},
                        json=TICKET,
                        timeout=httpx.Timeout(5.0),
                    )
                    assert reply.status_code == 201, reply.content

                async def commit() -> None:
                    await probe.execute("INSERT INTO bench_commit DEFAULT VALUES")

                async def select() -> None:
                    await probe.execute("SELECT 1")

                jobs: dict[str, Callable[[], Awaitable[None]]] = {
                    "INSERT + COMMIT": commit,
                    "SELECT 1": select,
                    "POST (lean client)": post,
                    **{f"{kind} run": functools.partial(run, kind) for kind in AGENTS},
                }
                try:
                    for _ in range(5):  # warm-up: connections, caches, first-call imports
                        for go in jobs.values():
                            await go()
                    PARTS.clear()
                    await probe.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    await probe.execute("SELECT pg_stat_statements_reset()")
                    for _ in range(RUNS):
                        for name, go in jobs.items():
                            current[0] = name
                            calls = len(PARTS["steps.think"])
                            start = time.perf_counter_ns()
                            await go()
                            runs[name].append((time.perf_counter_ns() - start) / 1e6)
                            # Each steps.think by the kind of run and its place in the run.
                            made = PARTS["steps.think"][calls:]
                            for place, ms in enumerate(made):
                                PARTS[f"steps.think {place + 1}, {name}"].append(ms)
                    if STATEMENTS:
                        await _statements(probe)
                finally:
                    await client.aclose()
                    await probe.close()
                    await ends.close()
                return {}

            run_in_worker(settings, url, body, services=[relay_service])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    _report(runs)


async def _statements(conn: psycopg.AsyncConnection[Any]) -> None:
    """The statements that took the server's time during the measured runs (pg_stat_statements:
    calls, mean and total milliseconds): where the database work of each run goes."""
    cursor = await conn.execute(
        "SELECT calls, mean_exec_time, total_exec_time, query FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY total_exec_time DESC LIMIT %s",
        (STATEMENTS,),
    )
    print("\nstatements by server time (calls, mean ms, total ms):")
    for calls, mean, total, query in await cursor.fetchall():
        text = " ".join(str(query).split())[:110]
        print(f"  {calls:6d} {mean:7.3f} {total:9.1f}  {text}")


def _report(runs: dict[str, list[float]]) -> None:
    med = {name: statistics.median(ms) for name, ms in runs.items()}
    print(
        f"\nturn_write_parts: one run of each kind at a time, {RUNS} times "
        f"(medians, ms, {time.strftime('%Y-%m-%d %H:%M')})"
    )
    for name, value in med.items():
        print(f"  {name:<40} {value:8.2f}")
    read_turn = med["read run"] - med["answer run"]
    write_turn = med["write run"] - med["answer run"]
    print(f"  {'read-tool turn (read - answer)':<40} {read_turn:8.2f}")
    print(f"  {'write-tool turn (write - answer)':<40} {write_turn:8.2f}  (downstream included)")
    print("  parts (n, median, first quartile):")
    for label in sorted(PARTS):
        values = PARTS[label]
        if len(values) < 4 or label == "steps.think":
            continue
        quartile = statistics.quantiles(values, n=4)[0]
        print(f"    {label:<38} {len(values):5d} {statistics.median(values):8.2f} {quartile:8.2f}")
    figures = [Figure(f"{name}, median", value, "ms") for name, value in med.items()]
    figures.append(Figure("read-tool turn (read - answer)", read_turn, "ms"))
    figures.append(
        Figure("write-tool turn (write - answer)", write_turn, "ms", None, "downstream in")
    )
    baseline = Baseline("an answer-only run, the same rounds", med["answer run"], "ms")
    publish("turn_write_parts", __doc__, baseline, figures)


if __name__ == "__main__":
    main()
