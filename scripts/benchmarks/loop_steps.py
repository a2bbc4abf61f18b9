"""What Ledgerloop adds to a think step and to a read-tool step, against what DBOS itself
costs per step.

Every variant is one DBOS workflow of N steps on the same worker, interleaved, so noise on
this shared machine hits them alike. A bare DBOS step doing the same work (the same model call
through the same SDK client, the same tool handler) is subtracted from Ledgerloop's step, so
the figure is Ledgerloop's overhead alone, not the work; it is compared with an empty DBOS
step, DBOS's own bookkeeping per step. A ratio of the whole steps would hide the overhead
behind the work (a 10 ms model call makes any overhead look small).
"""

from __future__ import annotations

from typing import Any

from dbos import DBOS

from ledgerloop.agent import steps
from ledgerloop.agent.dbos_step_start import dbos_own_step_start
from ledgerloop.db.dbos_checkpoint import dbos_own_checkpoint
from ledgerloop.db.dbos_journal import dbos_own_check
from ledgerloop.examples.ops_agent import OPS_AGENT, SearchArgs, search_kb
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime
from ledgerloop.tools.registry import ToolContext
from scripts.benchmarks.common import (
    database,
    per_unit_ms,
    report,
    run_in_worker,
    scripted,
    settings_for,
    timed,
)
from scripts.benchmarks.results import Baseline, publish, size

STEPS = int(size("BENCH_LOOP_STEPS", "20", "2"))
ROUNDS = int(size("BENCH_LOOP_ROUNDS", "12", "1"))
MESSAGES = [{"role": "user", "content": "db-1 disk is full"}]
CALL = {"id": "toolu_bench", "name": "search_kb", "input": {"query": "disk full"}}


async def _bare_model() -> dict[str, Any]:
    from ledgerloop.runtime import get_runtime

    rt = get_runtime()
    message = await rt.model.sdk().messages.create(
        model=rt.model.model_for("cheap"),
        max_tokens=OPS_AGENT.max_tokens,
        system=OPS_AGENT.system,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[t.schema() for t in OPS_AGENT.tools],  # type: ignore[misc]
    )
    data: dict[str, Any] = message.model_dump(mode="json")
    return data


async def _bare_tool() -> Any:
    assert search_kb.handler is not None
    ctx = ToolContext("r", "c", "t", "k")
    return await search_kb.handler(SearchArgs(query="disk full"), ctx)


async def _nothing() -> None:
    return None


@DBOS.workflow(name="bench_bare_empty")
async def bench_bare_empty(n: int) -> None:
    for i in range(n):
        await DBOS.run_step_async({"name": f"s-{i}"}, _nothing)


@DBOS.workflow(name="bench_bare_model")
async def bench_bare_model(n: int) -> None:
    for i in range(n):
        await DBOS.run_step_async({"name": f"s-{i}"}, _bare_model)


@DBOS.workflow(name="bench_bare_tool")
async def bench_bare_tool(n: int) -> None:
    for i in range(n):
        await DBOS.run_step_async({"name": f"s-{i}"}, _bare_tool)


@DBOS.workflow(name="bench_think")
async def bench_think(run_id: str, n: int) -> None:
    for i in range(n):
        name = f"think-{i}"
        await DBOS.run_step_async(
            {"name": name}, steps.think, run_id, name, "ops", "cheap", MESSAGES
        )


@DBOS.workflow(name="bench_tool")
async def bench_tool(run_id: str, tenant: str, n: int) -> None:
    for i in range(n):
        name = f"tool-{i}-bench"
        await DBOS.run_step_async(
            {"name": name}, steps.run_read_tool, run_id, tenant, name, "ops", CALL
        )


async def measure(runtime: Runtime) -> dict[str, Any]:
    with runtime.pool.connection() as conn:
        conn.autocommit = True
        run_ids = [
            str(start_run(conn, agent="ops", input={"message": "bench"})) for _ in range(ROUNDS + 1)
        ]
        found = conn.execute("SELECT tenant_id FROM ledgerloop.agent_run LIMIT 1").fetchone()
        assert found is not None
        tenant = str(found["tenant_id"])
        # Runs exist only to own the steps; keep them out of the worker's queue.
        conn.execute("DELETE FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)", (run_ids,))
        conn.execute(
            "UPDATE ledgerloop.agent_run SET status = 'planning' WHERE id = ANY(%s::uuid[])",
            (run_ids,),
        )

    async def go(fn: Any, *args: Any) -> None:
        await fn(*args)

    kinds = ("bare_empty", "bare_model", "think", "bare_tool", "tool")
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    # One warm-up round, then interleaved rounds.
    for r in range(ROUNDS + 1):
        run_id = run_ids[r]
        # The floor is DBOS's own step (its own journal check and checkpoint); the other steps
        # all get the worker's, so their differences are Ledgerloop's step bodies alone.
        with dbos_own_check(), dbos_own_checkpoint(), dbos_own_step_start():
            t_bare_empty = await timed(lambda: go(bench_bare_empty, STEPS))
        t_bare_model = await timed(lambda: go(bench_bare_model, STEPS))
        t_think = await timed(lambda: go(bench_think, run_id, STEPS))  # noqa: B023
        t_bare_tool = await timed(lambda: go(bench_bare_tool, STEPS))
        t_tool = await timed(lambda: go(bench_tool, run_id, tenant, STEPS))  # noqa: B023
        if r:
            samples["bare_empty"].append(t_bare_empty)
            samples["bare_model"].append(t_bare_model)
            samples["think"].append(t_think)
            samples["bare_tool"].append(t_bare_tool)
            samples["tool"].append(t_tool)
    result = {k: per_unit_ms(v, STEPS) for k, v in samples.items()}
    # Paired by round: the same noise hit both sides of each difference.
    for name, (ours, bare) in {
        "think_over": ("think", "bare_model"),
        "tool_over": ("tool", "bare_tool"),
    }.items():
        diffs = [a - b for a, b in zip(samples[ours], samples[bare], strict=True)]
        result[name] = per_unit_ms(diffs, STEPS)
    return result


def main() -> None:
    script = "default: {turns: [{tool_use: {name: search_kb, input: {query: disk}}}]}"
    with database() as url, scripted(script) as model:
        result = run_in_worker(settings_for(url, model.url), url, measure)
    floor = result["bare_empty"]
    report(
        f"loop steps ({STEPS} steps x {ROUNDS} rounds, median ms per step)",
        [
            ("empty DBOS step (DBOS's own bookkeeping)", floor, "baseline"),
            ("bare DBOS step calling the model", result["bare_model"], ""),
            ("Ledgerloop think step", result["think"], ""),
            (
                "  Ledgerloop's overhead on a think step",
                result["think_over"],
                f"{result['think_over'] / floor:.2f}x an empty DBOS step",
            ),
            ("bare DBOS step calling the tool handler", result["bare_tool"], ""),
            ("Ledgerloop read tool step", result["tool"], ""),
            (
                "  Ledgerloop's overhead on a read tool step",
                result["tool_over"],
                f"{result['tool_over'] / floor:.2f}x an empty DBOS step",
            ),
        ],
    )
    publish("loop_steps", __doc__, Baseline("an empty DBOS step", floor, "ms"))


if __name__ == "__main__":
    main()
