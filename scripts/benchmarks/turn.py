"""A whole 5-turn tool-using run, side by side: bare DBOS, Ledgerloop, and (when the `bench`
extra is installed) LangGraph with PostgresSaver.

The job is the same everywhere: the model asks for one read tool five times, then answers.
Every system calls the same zero-latency scripted model through the same `anthropic` SDK and
the same tool handler. Each system's database work is read from Postgres itself, the same way
for all: statements from pg_stat_statements, durable commits (commit records) and WAL bytes
from pg_walinspect over the LSN range of the round. That needs both extensions, so the bench
runs on a private cluster of its own (local binaries) with pg_stat_statements preloaded.

Rounds alternate between the systems, so the noise of this shared machine hits them alike;
figures are medians over rounds, per run.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dbos import DBOS
from pydantic import BaseModel

from ledgerloop.agent.dbos_step_start import dbos_own_step_start
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.dbos_checkpoint import dbos_own_checkpoint
from ledgerloop.db.dbos_journal import dbos_own_check
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime, get_runtime
from ledgerloop.testing.postgres import DatabaseFactory
from ledgerloop.tools.registry import ToolContext, read_tool
from scripts.benchmarks.common import run_in_worker, scripted, settings_for
from scripts.benchmarks.results import Baseline, Figure, publish, used_database
from scripts.benchmarks.results import size as sized
from scripts.benchmarks.run_ends import RunEnds, run_ends

TURNS = 5
ROUNDS = int(sized("BENCH_TURN_ROUNDS", "5", "1"))
RUNS = int(sized("BENCH_TURN_RUNS", "20", "1"))
AGENT = "bench_turns"
SYSTEM = "You look things up."
MAX_TOKENS = 512

SCRIPT = (
    "default: {turns: ["
    + ", ".join(f"{{tool_use: {{name: lookup, input: {{key: k{i}}}}}}}" for i in range(TURNS))
    + ', {text: "done"}]}'
)


class LookupArgs(BaseModel):
    key: str


def _lookup_value(key: str) -> str:
    return f"value of {key}"


@read_tool("lookup", "Look a key up.", LookupArgs)
async def lookup(args: LookupArgs, ctx: ToolContext) -> str:
    return _lookup_value(args.key)


BENCH_AGENT = register_agent(Agent(name=AGENT, system=SYSTEM, tools=(lookup,)))
TOOLS = [t.schema() for t in BENCH_AGENT.tools]


# -- bare DBOS: the same turns as async steps -----------------------------------------------


async def _bare_think(messages: list[dict[str, Any]]) -> dict[str, Any]:
    rt = get_runtime()
    message = await rt.model.sdk().messages.create(
        model=rt.model.model_for("cheap"),
        max_tokens=MAX_TOKENS,
        system=SYSTEM,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    content: list[dict[str, Any]] = [b.model_dump(mode="json") for b in message.content]
    return {"content": content}


async def _bare_tool(key: str) -> str:
    return _lookup_value(key)


@DBOS.workflow(name="bench_bare_turns")
async def bench_bare_turns(text: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    for i in range(TURNS + 2):
        reply = await DBOS.run_step_async({"name": f"think-{i}"}, _bare_think, messages)
        calls = [b for b in reply["content"] if b["type"] == "tool_use"]
        messages.append({"role": "assistant", "content": reply["content"]})
        if not calls:
            return "".join(b.get("text", "") for b in reply["content"])
        results = []
        for call in calls:
            out = await DBOS.run_step_async(
                {"name": f"tool-{i}-{call['id']}"}, _bare_tool, call["input"]["key"]
            )
            results.append({"type": "tool_result", "tool_use_id": call["id"], "content": out})
        messages.append({"role": "user", "content": results})
    return "iteration_cap"


# -- what Postgres says a round cost --------------------------------------------------------


@dataclass
class Cost:
    seconds: float
    statements: int
    commits: int
    wal_bytes: int


class Meter:
    """Statements, commit records and WAL bytes of one database between two marks."""

    #: The bench's own queries carry this marker (a column alias) and are not counted.
    MARK = "bench_meter"

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.dbname = self.conn.info.dbname

    def start(self) -> tuple[str, float]:
        self.conn.execute("SELECT pg_stat_statements_reset()")
        row = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text AS bench_meter")
        lsn = row.fetchone()
        assert lsn is not None
        return str(lsn[0]), time.perf_counter()

    def stop(self, mark: tuple[str, float]) -> Cost:
        seconds = time.perf_counter() - mark[1]
        end = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text AS bench_meter")
        end_lsn = end.fetchone()
        assert end_lsn is not None
        stats = self.conn.execute(
            """
            SELECT coalesce(sum(s.calls), 0)::bigint AS bench_meter
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = %s AND s.query NOT LIKE %s
              AND s.query NOT LIKE 'SELECT pg_stat_statements_reset%%'
            """,
            (self.dbname, f"%{self.MARK}%"),
        ).fetchone()
        if end_lsn[0] == mark[0]:
            # Nothing was written (a job that only talks to a downstream): pg_walinspect
            # refuses a range that starts at the flush position.
            assert stats is not None
            return Cost(seconds, int(stats[0]), 0, 0)
        wal = self.conn.execute(
            """
            SELECT count(*) FILTER (WHERE resource_manager = 'Transaction'
                                      AND record_type LIKE 'COMMIT%%') AS bench_meter,
                   pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint
            FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
            """,
            (end_lsn[0], mark[0], mark[0], end_lsn[0]),
        ).fetchone()
        assert stats is not None
        assert wal is not None
        return Cost(seconds, int(stats[0]), int(wal[0]), int(wal[1]))

    def detail(self, mark: tuple[str, float], runs: int) -> None:
        """Print where the round's statements and WAL went (BENCH_TURN_DETAIL=1): calls per
        run by query, and WAL bytes per run by relation and by record type."""
        end = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text AS bench_meter")
        end_lsn = end.fetchone()
        assert end_lsn is not None
        queries = self.conn.execute(
            """
            SELECT s.calls AS bench_meter, s.mean_exec_time,
                   regexp_replace(left(s.query, 100), '\\s+', ' ', 'g')
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = %s AND s.query NOT LIKE %s
              AND s.query NOT LIKE 'SELECT pg_stat_statements_reset%%'
            ORDER BY s.calls DESC
            """,
            (self.dbname, f"%{self.MARK}%"),
        ).fetchall()
        print("    calls/run  mean ms  query")
        for calls, mean_ms, query in queries:
            print(f"    {calls / runs:9.1f}  {mean_ms:7.3f}  {query}")
        rels = self.conn.execute(
            """
            SELECT coalesce(c.relname, w.rel, w.resource_manager) AS bench_meter,
                   sum(w.record_length)::bigint, sum(w.fpi_length)::bigint, count(*)
            FROM (SELECT *, substring(block_ref from 'rel \\d+/\\d+/(\\d+)') AS rel
                  FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)) w
            LEFT JOIN pg_class c ON c.relfilenode::text = w.rel
            GROUP BY 1 ORDER BY 2 DESC
            """,
            (mark[0], end_lsn[0]),
        ).fetchall()
        outputs = self.conn.execute(
            """
            SELECT regexp_replace(o.function_name, '-.*', '') AS bench_meter, count(*),
                   avg(length(o.output))::int, max(left(o.output, 300))
            FROM dbos.operation_outputs o JOIN dbos.workflow_status w USING (workflow_uuid)
            WHERE w.created_at >= (extract(epoch FROM now()) * 1000)::bigint - 60000
            GROUP BY 1 ORDER BY 1
            """
        ).fetchall()
        print("    journaled step outputs (steps, mean bytes, a sample):")
        for name, count, size, sample in outputs:
            print(f"    {count:6d} {size:6d}  {name}: {sample}")
        print("    WAL bytes/run by relation (record, of it full-page images, records):")
        for name, size, fpi, count in rels:
            print(f"    {size / runs:8.0f} {fpi / runs:8.0f} {count / runs:6.1f}  {name}")

    def close(self) -> None:
        self.conn.close()


# -- the systems ------------------------------------------------------------------------------


async def _run_bare(n: int) -> None:
    # The worker's DBOS instance answers its journal check and writes its checkpoints with
    # Ledgerloop's statements; bare DBOS is measured with DBOS's own.
    with dbos_own_check(), dbos_own_checkpoint(), dbos_own_step_start():
        for _ in range(n):
            handle = await DBOS.start_workflow_async(bench_bare_turns, f"bench {uuid.uuid4()}")
            answer = await handle.get_result()
            assert answer == "done", answer


async def _run_ledgerloop(
    runtime: Runtime,
    ends: RunEnds,
    n: int,
    agent: str = AGENT,
    tag: str = "bench",
) -> None:
    for _ in range(n):
        with runtime.pool.connection() as conn:
            conn.autocommit = True
            run_id = start_run(conn, agent=agent, input={"message": f"{tag} {uuid.uuid4()}"})
        # Waiting for the run is the bench's own work, told by the run's last commit
        # (scripts/benchmarks/run_ends.py) and not counted.
        status = await ends.wait(str(run_id))
        assert status == "succeeded", f"run {run_id} ended {status}"


System = Callable[[int], Awaitable[None]]


async def _measure(meter: Meter, systems: dict[str, System]) -> dict[str, list[Cost]]:
    costs: dict[str, list[Cost]] = {name: [] for name in systems}
    for go in systems.values():  # warm-up: connections, caches, first-call imports
        await go(2)
    for _ in range(ROUNDS):
        for name, go in systems.items():
            mark = meter.start()
            await go(RUNS)
            costs[name].append(meter.stop(mark))
    if os.environ.get("BENCH_TURN_DETAIL"):
        for name, go in systems.items():
            print(f"\n  {name}: statements per run by query")
            mark = meter.start()
            await go(RUNS)
            meter.detail(mark, RUNS)
    return costs


def _langgraph_system(url: str, model_url: str) -> System | None:
    """LangGraph + PostgresSaver doing the same turns, if the bench extra is installed."""
    try:
        from scripts.benchmarks.turn_langgraph import langgraph_system
    except ImportError:
        return None
    return langgraph_system(url, model_url, SYSTEM, MAX_TOKENS, TOOLS, _lookup_value)


def _median(costs: list[Cost], field: str) -> float:
    return float(statistics.median(getattr(c, field) for c in costs)) / RUNS


@contextmanager
def _metered_cluster() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ledgerloop-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.init()
        with (cluster.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "pg_stat_statements.track_utility = on\n"
            )
        cluster.start()
        try:
            factory = DatabaseFactory(cluster.url)
            url = factory.create()
            used_database(url)
            yield url
        finally:
            cluster.destroy()


def main() -> None:
    with _metered_cluster() as url, scripted(SCRIPT) as model:
        meter = Meter(url)
        langgraph = _langgraph_system(url, model.url)

        async def body(runtime: Runtime) -> dict[str, Any]:
            ends = await run_ends(url)
            systems: dict[str, System] = {
                "bare DBOS (async steps)": _run_bare,
                "Ledgerloop": lambda n: _run_ledgerloop(runtime, ends, n),
            }
            if langgraph is not None:
                systems["LangGraph + PostgresSaver"] = langgraph
            try:
                return {"costs": await _measure(meter, systems)}
            finally:
                await ends.close()

        settings = settings_for(url, model.url)
        result = run_in_worker(settings, url, body)
        meter.close()
    costs: dict[str, list[Cost]] = result["costs"]
    base = costs["bare DBOS (async steps)"]
    print(
        f"\nturn: a {TURNS}-turn read-tool run, {ROUNDS} rounds x {RUNS} runs "
        "(medians per run; ratios against bare DBOS in the same run)"
    )
    print(f"  {'system':<28} {'ms/run':>8} {'stmts':>7} {'commits':>8} {'WAL KB':>8}   ratios")
    figures: list[Figure] = []
    for name, rows in costs.items():
        ms = _median(rows, "seconds") * 1000
        stmts = _median(rows, "statements")
        commits = _median(rows, "commits")
        wal = _median(rows, "wal_bytes") / 1024
        ratio = (
            f"{ms / (_median(base, 'seconds') * 1000):.2f}x time, "
            f"{stmts / _median(base, 'statements'):.2f}x stmts, "
            f"{wal * 1024 / _median(base, 'wal_bytes'):.2f}x WAL"
        )
        print(f"  {name:<28} {ms:>8.1f} {stmts:>7.0f} {commits:>8.1f} {wal:>8.1f}   {ratio}")
        of_time = ms / (_median(base, "seconds") * 1000)
        figures.append(Figure(f"{name}: time per run", ms, "ms", of_time))
        of_stmts = stmts / _median(base, "statements")
        figures.append(Figure(f"{name}: statements per run", stmts, "", of_stmts))
        of_wal = wal * 1024 / _median(base, "wal_bytes")
        figures.append(Figure(f"{name}: WAL per run", wal, "KB", of_wal))
        figures.append(Figure(f"{name}: durable commits per run", commits))
    if langgraph is None:
        print("  (LangGraph not installed: pip install -e '.[bench]' to add it)")
    baseline = Baseline("bare DBOS, the same turns as async steps, same run")
    publish("turn", __doc__, baseline, figures)


if __name__ == "__main__":
    main()
