"""Where a write-tool run's time goes, against a read-tool run's: a timeline of one run.

The `turn_write` jobs, one run at a time, with a mark at the start and end of each part of
the turn (DBOS's journal check and checkpoint, the model call, the checkpoint that carries a
write recorded ahead, the relay's send, its attempt and the transport's exchange, the
outcome's record, the write step's own work). For each kind it prints the usual order of
the marks and, for each mark, the median time from the run's start and from the mark before
it; then the median of a few spans over every run that has them (the usual order is only
some of the runs). A diagnostic, not a ratio: the marks wrap functions of the running
code, so they cost a little time themselves and the figures are for comparing the parts,
not for the turn's total. BENCH_TIMELINE_RUNS (300); BENCH_TIMELINE_PAUSE_MS (0): a pause
before each run, so that the last one's tail (its checkpoint after the answer's save) is
over before the next one starts. BENCH_TURN_WRITE_ANSWER_AHEAD=off as in `turn_write`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from ledgerloop.agent import steps, turn_tools, write_ahead, write_steps
from ledgerloop.db import dbos_checkpoint, dbos_journal
from ledgerloop.effects import relay
from ledgerloop.effects.transport import LeanTransport
from ledgerloop.runtime import Runtime
from ledgerloop.services import relay_service
from scripts.benchmarks import turn_write
from scripts.benchmarks.common import policy_file, run_in_worker, scripted, settings_for
from scripts.benchmarks.effects import ticket_service
from scripts.benchmarks.results import Baseline, Figure, publish, size
from scripts.benchmarks.run_ends import run_ends
from scripts.benchmarks.turn import _metered_cluster, _run_ledgerloop

RUNS = int(size("BENCH_TIMELINE_RUNS", "300", "3"))
PAUSE_S = int(os.environ.get("BENCH_TIMELINE_PAUSE_MS", "0")) / 1000

_marks: list[tuple[int, str]] = []


def _mark(label: str) -> None:
    _marks.append((time.perf_counter_ns(), label))


def _timed_async(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(label + ">")
        try:
            return await fn(*args, **kwargs)
        finally:
            _mark(label + "<")

    setattr(owner, name, timed)


def _timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(label + ">")
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(label + "<")

    return timed


def _timed_factory(owner: Any, name: str, label: str) -> None:
    """Time what `owner.name(...)` returns (the journal check and checkpoint DBOS calls)."""
    make = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: _timed(make(*a, **k), label))


def _instrument() -> None:
    _timed_async(steps, "think", "model")  # the model call (and, for a read, its tools)
    _timed_async(turn_tools, "think_after_tools", "think-after-writes")
    _timed_async(write_steps, "_record_effect", "write-step")
    _timed_async(relay.Relay, "_attempt", "post")
    _timed_async(relay.Relay, "send_now", "send")
    _timed_async(LeanTransport, "exchange", "exchange")
    _timed_async(relay, "outbox_record", "outcome-record")
    _timed_factory(dbos_journal, "journal_check", "journal-check")
    _timed_factory(dbos_checkpoint, "checkpoint", "checkpoint")
    dbos_checkpoint._with_rider = _timed(dbos_checkpoint._with_rider, "with-record")
    committed = write_ahead._Record.committed
    write_ahead._Record.committed = _timed(committed, "committed")  # type: ignore[method-assign]


#: Spans measured in every run that has both marks, whatever the order of the rest: from
#: the last `start` mark to the first `end` mark after it.
SPANS = (
    ("checkpoint<", "journal-check>"),
    ("with-record>", "with-record<"),
    ("committed<", "send>"),
    ("send>", "exchange>"),
    ("exchange>", "exchange<"),
    ("exchange<", "send<"),
    ("send<", "write-step<"),
    ("write-step>", "write-step<"),
    ("outcome-record>", "outcome-record<"),
    # The write's commit to the next model call, and where in it that call waits: for the
    # answer (send<), or for the next step's journal check when it has one (exchange>).
    ("checkpoint<", "model>"),
    ("send<", "model>"),
    ("exchange>", "journal-check>"),
)


def _spans(runs: list[list[tuple[int, str]]]) -> list[str]:
    lines = ["  spans in every run that has them (median, first quartile, ms):"]
    for start, end in SPANS:
        took = []
        for run in runs:
            began = [t for t, label in run if label == start]
            if not began:
                continue
            ended = [t for t, label in run if label == end and t >= began[-1]]
            if ended:
                took.append((ended[0] - began[-1]) / 1e6)
        if took:
            took.sort()
            lines.append(
                f"    {start:>16} .. {end:<16} {statistics.median(took):6.2f} "
                f"{took[len(took) // 4]:6.2f}  ({len(took)} runs)"
            )
    return lines


def _timeline(runs: list[list[tuple[int, str]]]) -> list[str]:
    orders = collections.Counter(tuple(label for _, label in run) for run in runs)
    usual, count = orders.most_common(1)[0]
    alike = [run for run in runs if tuple(label for _, label in run) == usual]
    lines = [f"  {count} of {len(runs)} runs in the usual order (ms from the start, +since before)"]
    for i, label in enumerate(usual):
        at = statistics.median((run[i][0] - run[0][0]) / 1e6 for run in alike)
        gap = statistics.median((run[i][0] - run[i - 1][0]) / 1e6 for run in alike) if i else 0
        lines.append(f"    {at:7.2f}  (+{gap:5.2f})  {label}")
    return lines


def main() -> None:
    _instrument()
    proc, tickets_url = ticket_service()
    try:
        with (
            _metered_cluster() as url,
            scripted(turn_write.SCRIPT) as model,
            policy_file(turn_write.POLICY) as policy,
        ):
            settings = settings_for(
                url, model.url, policy_file=policy, destinations={"tickets": tickets_url}
            )

            async def body(runtime: Runtime) -> dict[str, Any]:
                ends = await run_ends(url)
                lines: list[str] = []
                took: dict[str, float] = {}
                try:
                    for kind in ("read", "write"):
                        agent = turn_write.AGENTS[kind].name
                        await _run_ledgerloop(runtime, ends, 30, agent=agent, tag=kind.upper())
                        runs = []
                        for _ in range(RUNS):
                            if PAUSE_S:
                                await asyncio.sleep(PAUSE_S)
                            _marks.clear()
                            _mark("start")
                            await _run_ledgerloop(runtime, ends, 1, agent=agent, tag=kind.upper())
                            _mark("end")
                            runs.append(list(_marks))
                        lines += [f"\n{kind}-tool run:", *_timeline(runs), *_spans(runs)]
                        took[kind] = statistics.median((r[-1][0] - r[0][0]) / 1e6 for r in runs)
                finally:
                    await ends.close()
                return {"lines": lines, "took": took}

            result = run_in_worker(settings, url, body, services=[relay_service])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"\nturn_write_timeline: {RUNS} runs of each, one at a time")
    print("\n".join(result["lines"]))
    took = result["took"]
    write = Figure("a write-tool run, start .. end, median", took["write"], "ms")
    baseline = Baseline("a read-tool run, start .. end, median", took["read"], "ms")
    publish("turn_write_timeline", __doc__, baseline, [write])


if __name__ == "__main__":
    main()
