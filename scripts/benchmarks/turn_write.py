"""A write-tool turn against a read-tool turn, on Ledgerloop, side by side in one run.

Three one-run jobs with the same zero-latency scripted model: an answer only; one read-tool
turn then the answer; one write-tool turn (its effect and outbox row in one commit, the
relay's delivery to the ticket service in its own process, the outcome back to the run)
then the answer. A turn costs its run less the answer-only run; the write turn's downstream
time (the same POST to the same ticket service through the relay's own keep-alive client,
timed in the same rounds) is left out too. Each such POST follows an answer-only run, as
inside a write run: the ticket service has been idle for a run, and this process and
Postgres are busy. An idle ticket service takes about twice the CPU per POST it takes when
POSTs come back to back, which the baseline timed until 2026-12-04
(BENCH_TURN_WRITE_DOWNSTREAM_TIMING=back-to-back subtracts that one; both are reported).
BENCH_TURN_WRITE_BASELINE_CLIENT=httpx times that POST through httpx's client instead, as
this bench did before 2026-12-04: its own CPU (about 0.4 ms more per POST than the relay's
client) was then subtracted from the write turn as if it were the downstream's. Target: a
write-tool turn <= 1.5x a read-tool turn (also reported as the median of the same ratio
taken within each round). Database work per run is read from Postgres as in `turn`.
BENCH_TURN_WRITE_ROUNDS, BENCH_TURN_WRITE_RUNS, BENCH_TURN_WRITE_MODEL,
BENCH_TURN_WRITE_DOWNSTREAM_MS (the ticket service's own time per ticket),
BENCH_TURN_WRITE_DOWNSTREAM_CPU (Linux: the one CPU the ticket service may run on; unset,
it runs wherever the kernel puts it, as in the issue's measurement). On a two-core machine
the ticket service, woken by the relay's request, sometimes (about one send in ten here)
preempts the worker's event loop on its own core for the whole of its work
(docs/benchmarks.md); pinning it to one CPU makes that rarer, to see what it costs. It also
reports the CPU each job cost per run, by process (this one, which holds the worker and,
unless BENCH_TURN_WRITE_MODEL=process, the scripted model; Postgres; the ticket service),
and the same turn ratio taken on CPU: the time ratio moves with the hour, the CPU one much
less. BENCH_TURN_WRITE_ANSWER_AHEAD=off: the step after a write checks its journal itself,
as before 2026-12-04 (its check is answered ahead by the write's checkpoint otherwise:
db.dbos_journal.answer_ahead), to compare both in one hour; `turn_write_timeline` reads it
too.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

import httpx
from pydantic import BaseModel

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.db import dbos_journal
from ledgerloop.effects.delivery import Answered
from ledgerloop.effects.transport import LeanClient, LeanTransport
from ledgerloop.runtime import Runtime
from ledgerloop.services import relay_service
from ledgerloop.tools.registry import HttpEffect, ToolContext, read_tool, write_tool
from scripts.benchmarks.common import (
    policy_file,
    run_in_worker,
    scripted,
    scripted_process,
    settings_for,
)
from scripts.benchmarks.cpu import ProcessCpu
from scripts.benchmarks.effects import ticket_service
from scripts.benchmarks.results import REPORTED, Baseline, Figure, publish, size
from scripts.benchmarks.run_ends import run_ends
from scripts.benchmarks.turn import Cost, Meter, _metered_cluster, _run_ledgerloop

ROUNDS = int(size("BENCH_TURN_WRITE_ROUNDS", "15", "1"))
RUNS = int(size("BENCH_TURN_WRITE_RUNS", "10", "1"))
#: "thread": the scripted model on a thread of the worker's process (as in `turn`); "process":
#: in a process of its own, as a real model service is.
MODEL = os.environ.get("BENCH_TURN_WRITE_MODEL", "thread")
#: The ticket service's own time per ticket, in ms (0: as fast as it goes; a real downstream
#: takes tens of milliseconds, which the relay's send may overlap with the step's ending).
DOWNSTREAM_MS = int(os.environ.get("BENCH_TURN_WRITE_DOWNSTREAM_MS", "0"))
DOWNSTREAM_CPU = os.environ.get("BENCH_TURN_WRITE_DOWNSTREAM_CPU")
BASELINE_CLIENT = os.environ.get("BENCH_TURN_WRITE_BASELINE_CLIENT", "relay")
if BASELINE_CLIENT not in ("relay", "httpx"):
    raise SystemExit(
        f"BENCH_TURN_WRITE_BASELINE_CLIENT={BASELINE_CLIENT!r}: use relay (the default) or httpx"
    )
#: "spaced": each baseline POST right after an answer-only run, as a write run's POST
#: follows the run before it; "back-to-back": one POST after another, as before 2026-12-04
#: (the downstream then answers warm, in about half the CPU it takes inside a run). Both
#: are measured; this one is subtracted.
DOWNSTREAM_TIMING = os.environ.get("BENCH_TURN_WRITE_DOWNSTREAM_TIMING", "spaced")
if DOWNSTREAM_TIMING not in ("spaced", "back-to-back"):
    raise SystemExit(
        f"BENCH_TURN_WRITE_DOWNSTREAM_TIMING={DOWNSTREAM_TIMING!r}: "
        "use spaced (the default) or back-to-back"
    )
ANSWER_AHEAD = os.environ.get("BENCH_TURN_WRITE_ANSWER_AHEAD", "on")
if ANSWER_AHEAD not in ("on", "off"):
    raise SystemExit(f"BENCH_TURN_WRITE_ANSWER_AHEAD={ANSWER_AHEAD!r}: use on (the default) or off")
if ANSWER_AHEAD == "off":
    dbos_journal.AHEAD_S = -1.0  # every answer given ahead has expired when it is taken
TICKET = {"title": "disk full on db-1", "body": "clean up /var/log", "priority": "normal"}

SCRIPT = f"""
default: {{turns: [{{text: done}}]}}
conversations:
  - match: READ
    turns: [{{tool_use: {{name: bench_lookup, input: {{key: k0}}}}}}, {{text: done}}]
  - match: WRITE
    turns: [{{tool_use: {{name: bench_ticket, input: {TICKET}}}}}, {{text: done}}]
"""

POLICY = """
version: "bench"
tools:
  bench_ticket: {requires_approval: false, timeout_ms: 8000}
  bench_lookup: {requires_approval: false, timeout_ms: 2000}
  write_ticket: {requires_approval: true}   # the example agent the worker loads
destinations:
  tickets: http://127.0.0.1:9
"""


class KeyArgs(BaseModel):
    key: str


class TicketArgs(BaseModel):
    title: str
    body: str
    priority: str


@read_tool("bench_lookup", "Look a key up.", KeyArgs)
async def bench_lookup(args: KeyArgs, ctx: ToolContext) -> str:
    return f"value of {args.key}"


@write_tool(
    "bench_ticket",
    "File a ticket.",
    TicketArgs,
    HttpEffect(
        destination="tickets",
        method="POST",
        path="/idempotent/tickets",
        honours_idempotency=True,
        lookup_path="/idempotent/tickets/by-key/{key}",
    ),
)
def bench_ticket(args: Any) -> dict[str, Any]:
    ticket: TicketArgs = args
    return ticket.model_dump()


AGENTS = {
    name: register_agent(Agent(name=f"bench_{name}_turn", system="You act.", tools=tools))
    for name, tools in (("answer", ()), ("read", (bench_lookup,)), ("write", (bench_ticket,)))
}


def _pin(pid: int, cpu: str) -> None:
    """Every thread of process `pid` onto `cpu` (threads it starts later inherit it)."""
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(task), {int(cpu)})
    except (ValueError, OSError) as exc:
        raise SystemExit(
            f"BENCH_TURN_WRITE_DOWNSTREAM_CPU={cpu!r}: not a CPU this Linux machine has "
            f"({exc}); give one of {sorted(os.sched_getaffinity(0))}, or leave it unset"
        ) from exc


def main() -> None:
    proc, tickets_url = ticket_service()
    try:
        if DOWNSTREAM_CPU is not None:
            _pin(proc.pid, DOWNSTREAM_CPU)
        with (
            _metered_cluster() as url,
            scripted_process(SCRIPT) if MODEL == "process" else scripted(SCRIPT) as model,
            policy_file(POLICY) as policy,
        ):
            meter = Meter(url)
            settings = settings_for(
                url, model.url, policy_file=policy, destinations={"tickets": tickets_url}
            )

            async def body(runtime: Runtime) -> dict[str, Any]:
                ends = await run_ends(url)
                client = httpx.AsyncClient()
                relays = LeanClient(LeanTransport())

                async def post() -> None:
                    headers = {"Idempotency-Key": str(uuid.uuid4())}
                    url = f"{tickets_url}/idempotent/tickets"
                    reply: Answered
                    if BASELINE_CLIENT == "httpx":
                        reply = await client.post(url, json=TICKET, headers=headers)
                    else:
                        timeout = httpx.Timeout(10.0)
                        reply = await relays.request(
                            "POST", url, headers=headers, json=TICKET, timeout=timeout
                        )
                    assert reply.status_code == 201, reply.content

                async def back_to_back(n: int) -> None:
                    for _ in range(n):
                        await post()

                async def spaced(n: int) -> float:
                    """Seconds spent in the POSTs only, each right after an answer-only run
                    (not timed here; its work is taken off this job's counts below): the
                    ticket service has been idle for a run, while this process and Postgres
                    are busy, as when a write run sends."""
                    took = 0.0
                    for _ in range(n):
                        await systems["answer"](1)
                        start = time.perf_counter()
                        await post()
                        took += time.perf_counter() - start
                    return took

                def job(kind: str) -> Any:
                    agent = AGENTS[kind].name
                    tag = kind.upper()
                    return lambda n: _run_ledgerloop(runtime, ends, n, agent=agent, tag=tag)

                systems = {kind: job(kind) for kind in AGENTS}
                timings = {"spaced": spaced, "back-to-back": back_to_back}
                systems["downstream"] = timings[DOWNSTREAM_TIMING]
                other = next(t for t in timings if t != DOWNSTREAM_TIMING)
                systems[f"downstream {other}"] = timings[other]
                costs: dict[str, list[Cost]] = {name: [] for name in systems}
                cpu = ProcessCpu(url, {"ticket service": proc.pid})
                cpu_costs: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
                if DOWNSTREAM_MS:
                    slow = {"mode": "slow", "count": 10_000, "delay_ms": DOWNSTREAM_MS}
                    (await client.post(f"{tickets_url}/_faults", json=slow)).raise_for_status()
                try:
                    for go in systems.values():
                        await go(2)
                    for _ in range(ROUNDS):
                        for name, go in systems.items():
                            mark, before = meter.start(), cpu.sample()
                            spent = await go(RUNS)
                            cost = meter.stop(mark)
                            used = cpu.spent(before, cpu.sample())
                            if isinstance(spent, float):
                                # The spaced POSTs: only they are timed; the answer runs
                                # between them are taken off at this round's answer job's
                                # rate.
                                answer, answer_cpu = costs["answer"][-1], cpu_costs["answer"][-1]
                                cost = Cost(
                                    spent,
                                    cost.statements - answer.statements,
                                    cost.commits - answer.commits,
                                    cost.wal_bytes - answer.wal_bytes,
                                )
                                used = {g: used[g] - answer_cpu[g] for g in used}
                            costs[name].append(cost)
                            cpu_costs[name].append(used)
                    if os.environ.get("BENCH_TURN_DETAIL"):
                        for name in ("read", "write"):
                            print(f"\n  where a {name} run's work went:")
                            mark = meter.start()
                            await systems[name](RUNS)
                            meter.detail(mark, RUNS)
                finally:
                    await ends.close()
                    await client.aclose()
                    await relays.aclose()
                return {"costs": costs, "cpu": cpu_costs}

            result = run_in_worker(settings, url, body, services=[relay_service])
            meter.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    read_turn = _report(result["costs"])
    _report_cpu(result["cpu"])
    what = "a read-tool turn (a read-tool run less an answer-only run)"
    publish("turn_write", __doc__, Baseline(what, read_turn, "ms"))


def _med(rows: list[Cost], field: str) -> float:
    return float(statistics.median(getattr(c, field) for c in rows)) / RUNS


def _report(costs: dict[str, list[Cost]]) -> float:
    ms = {name: _med(rows, "seconds") * 1000 for name, rows in costs.items()}
    read_turn = ms["read"] - ms["answer"]
    write_turn = ms["write"] - ms["answer"] - ms["downstream"]
    print(
        f"\nturn_write: one tool turn then the answer, {ROUNDS} rounds x {RUNS} runs "
        f"(medians per run, {time.strftime('%Y-%m-%d')}; downstream takes {DOWNSTREAM_MS} ms, "
        f"timed {DOWNSTREAM_TIMING} through the {BASELINE_CLIENT} client; "
        f"answer ahead {ANSWER_AHEAD}"
        + (f", pinned to CPU {DOWNSTREAM_CPU})" if DOWNSTREAM_CPU is not None else ")")
    )
    print(f"  {'job':<34} {'ms/run':>8} {'stmts':>7} {'commits':>8} {'WAL KB':>8}")
    for name, rows in costs.items():
        stmts, commits = _med(rows, "statements"), _med(rows, "commits")
        wal = _med(rows, "wal_bytes") / 1024
        print(f"  {name:<34} {ms[name]:>8.1f} {stmts:>7.0f} {commits:>8.1f} {wal:>8.1f}")
    print(f"  read-tool turn (read - answer): {read_turn:.1f} ms")
    print(f"  write-tool turn (write - answer - downstream): {write_turn:.1f} ms")
    print(f"  ratio: {write_turn / read_turn:.2f}x (target <= 1.5x)")
    ratio = write_turn / read_turn
    REPORTED.append(Figure("write-tool turn", write_turn, "ms", ratio, "target <= 1.5x"))
    # The same ratio within each round (the four jobs ran back to back), then its median:
    # a machine that slows down for a while slows both turns of a round alike.
    paired = [
        (w.seconds - a.seconds - d.seconds) / (r.seconds - a.seconds)
        for a, r, w, d in zip(
            costs["answer"], costs["read"], costs["write"], costs["downstream"], strict=True
        )
        if r.seconds > a.seconds
    ]
    if paired:
        print(
            f"  ratio within each round, median of {len(paired)}: {statistics.median(paired):.2f}x"
        )
        within = statistics.median(paired)
        REPORTED.append(Figure("write / read turn within each round, median", within, "x", within))
    other = next(name for name in costs if name.startswith("downstream "))
    print(f"  ratio with the {other}: {(ms['write'] - ms['answer'] - ms[other]) / read_turn:.2f}x")
    with_other = (ms["write"] - ms["answer"] - ms[other]) / read_turn
    REPORTED.append(Figure(f"write / read turn with the {other}", with_other, "x", with_other))
    return read_turn


def _report_cpu(cpu: dict[str, list[dict[str, float]]]) -> None:
    """CPU per run by process (means over the rounds: /proc counts in 10 ms ticks), and the
    same ratio as above taken on CPU instead of time: what each turn costs the machine."""
    groups = list(next(iter(cpu.values()))[0])
    per_run = {
        job: {g: statistics.mean(r[g] for r in rounds) / RUNS * 1000 for g in groups}
        for job, rounds in cpu.items()
    }
    print(f"  CPU ms/run (mean of {ROUNDS} rounds): " + ", ".join(groups))
    for job, by_group in per_run.items():
        cells = " ".join(f"{by_group[g]:>8.2f}" for g in groups)
        print(f"  {job:<34} {cells} {sum(by_group.values()):>8.2f} total")
    total = {job: sum(by_group.values()) for job, by_group in per_run.items()}
    read_turn = total["read"] - total["answer"]
    write_turn = total["write"] - total["answer"] - total["downstream"]
    if read_turn > 0:
        print(
            f"  CPU: read-tool turn {read_turn:.2f} ms, write-tool turn {write_turn:.2f} ms "
            f"(less the downstream's), ratio {write_turn / read_turn:.2f}x"
        )
        on_cpu = write_turn / read_turn
        REPORTED.append(Figure("write / read turn on CPU", on_cpu, "x", on_cpu))


if __name__ == "__main__":
    main()
