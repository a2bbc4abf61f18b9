"""Tokens as they are generated (issue 36): what streaming costs a turn, and how soon the
first text delta reaches a subscriber of another process's kind (the HTTP app, through
`run_text` and its LISTEN), measured in one worker, in one run. The scripted model runs in
a process of its own, as a model service does.

1. The 5-turn read-tool run of `scripts/bench turn` (its final answer 60 words long), with
   LEDGERLOOP_STREAM_TEXT on (messages.stream, deltas and read tools' live events published)
   and off (messages.create), one run of each in turn: medians, ms per run, and the ratio.
0. The same run unstreamed, with and without the durable step.finished events (the bench
   turns them off by handing the checkpoint no run id: the statement then skips them), one
   run of each in turn: what the durable events add to a turn (medians, ms per run).
2. First-delta latency: a run whose model answers after 1 s (the subscriber is connected
   by then, even on a loaded machine) and writes a word every 20 ms, followed by an SSE
   subscriber of the real HTTP app: from the model server writing the first text delta to
   the subscriber reading it (both clocks are this machine's): p50 and p90 over the runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from ledgerloop.approvals.principals import principal_create
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db import dbos_checkpoint
from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime
from scripts.benchmarks import results
from scripts.benchmarks.common import (
    database,
    report,
    run_in_worker,
    scripted_process,
    settings_for,
)
from scripts.benchmarks.run_ends import run_ends
from scripts.benchmarks.streams import Server
from scripts.benchmarks.turn import AGENT, TURNS, _run_ledgerloop

ROUNDS = int(results.size("BENCH_STREAMS_TEXT_ROUNDS", "5", "1"))
RUNS = int(results.size("BENCH_STREAMS_TEXT_RUNS", "20", "2"))
LATENCY_RUNS = int(results.size("BENCH_STREAMS_LATENCY_RUNS", "30", "5"))

ANSWER = " ".join(f"word{i}" for i in range(60))
SCRIPT = (
    "default: {turns: ["
    + ", ".join(f"{{tool_use: {{name: lookup, input: {{key: k{i}}}}}}}" for i in range(TURNS))
    + f', {{text: "{ANSWER}"}}]}}'
    + "\nconversations:\n  - match: latency\n    turns:\n"
    + '      - {text: "one two three four five six", delay_ms: 1000, delta_delay_ms: 20}\n'
)


async def _pairs(
    runtime: Runtime, ends: Any, switch: Callable[[bool], None]
) -> tuple[list[float], list[float]]:
    """ms per run with `switch(True)` and with `switch(False)`, one run of each in turn (the
    order swapped every pair): this shared machine's noise hits both alike."""
    on: list[float] = []
    off: list[float] = []
    for i in range(ROUNDS * RUNS):
        for enabled in (True, False) if i % 2 == 0 else (False, True):
            switch(enabled)
            start = time.perf_counter()
            await _run_ledgerloop(runtime, ends, 1, agent=AGENT)
            (on if enabled else off).append((time.perf_counter() - start) * 1000)
    return on, off


def _sample(
    out: list[float], base: str, token: str, run_id: uuid.UUID, ready: threading.Event
) -> None:
    with contextlib.suppress(LookupError):
        out.append(_first_delta_at(base, token, run_id, ready))


def _first_deltas(model_url: str) -> list[float]:
    sent: list[float] = httpx.get(f"{model_url}/_first_deltas").json()["sent"]
    return sent


def _none(workflow_id: str) -> uuid.UUID | None:
    return None


def _first_delta_at(base: str, token: str, run_id: uuid.UUID, ready: threading.Event) -> float:
    """Follow the run's stream; when its first text.delta was read (time.time())."""
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=None)) as http,
        http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response,
    ):
        ready.set()
        for line in response.iter_lines():
            if line == "event: text.delta":
                return time.time()
    raise LookupError(f"run {run_id}'s stream ended without text")


def main() -> None:
    with database() as url, scripted_process(SCRIPT) as model:

        async def body(runtime: Runtime) -> dict[str, Any]:
            ends = await run_ends(url)
            try:
                await _run_ledgerloop(runtime, ends, 2)  # warm-up
                on = runtime.settings
                off = on.model_copy(update={"stream_text": False})
                recorded = dbos_checkpoint._run_id

                def events(enabled: bool) -> None:
                    runtime.settings = off
                    dbos_checkpoint._run_id = recorded if enabled else _none

                def streaming(enabled: bool) -> None:
                    runtime.settings = on if enabled else off
                    dbos_checkpoint._run_id = recorded

                # 0. durable step events on and off, unstreamed; 1. streamed and not.
                with_events, without_events = await _pairs(runtime, ends, events)
                streamed, plain = await _pairs(runtime, ends, streaming)
                runtime.settings = on
            finally:
                await ends.close()
            latencies = await asyncio.to_thread(_latencies, url, runtime)
            return {
                "plain": plain,
                "streamed": streamed,
                "latencies": latencies,
                "with_events": with_events,
                "without_events": without_events,
            }

        def _latencies(url: str, runtime: Runtime) -> list[float]:
            got: list[float] = []
            with connect(url, autocommit=True) as conn, Server(url) as server:
                _, token = principal_create(
                    conn, name="bench", roles=("viewer",), tenant_id=DEFAULT_TENANT
                )
                for i in range(LATENCY_RUNS):
                    run_id = start_run(
                        conn,
                        agent=AGENT,
                        input={"message": f"latency {i} {uuid.uuid4()}"},
                        tenant_id=DEFAULT_TENANT,
                    )
                    ready = threading.Event()
                    result: list[float] = []
                    reader = threading.Thread(
                        target=lambda r=run_id, ev=ready, out=result: _sample(
                            out, server.base, token, r, ev
                        ),
                        daemon=True,
                    )
                    sent_before = len(_first_deltas(model.url))
                    reader.start()
                    reader.join(60)
                    sent = _first_deltas(model.url)[sent_before:]
                    if result and sent:  # else the subscriber came too late: not a sample
                        got.append((result[0] - sent[0]) * 1000)
            return got

        settings = settings_for(url, model.url)
        fig = run_in_worker(settings, url, body)
    with_events = statistics.median(fig["with_events"])
    without_events = statistics.median(fig["without_events"])
    report(
        f"streams (events): the 5-turn run unstreamed, {ROUNDS * RUNS} runs each, alternating",
        [
            ("without durable step events (ms per run)", without_events, ""),
            ("with them (ms per run)", with_events, ""),
            ("ratio", with_events / without_events, "target <= 1.05"),
        ],
    )
    plain, streamed = statistics.median(fig["plain"]), statistics.median(fig["streamed"])
    report(
        f"streams (text): the 5-turn run, {ROUNDS * RUNS} runs each, alternating",
        [
            ("messages.create (ms per run)", plain, ""),
            ("streamed, deltas published (ms per run)", streamed, ""),
            ("ratio", streamed / plain, "target <= 1.05"),
        ],
    )
    lat = sorted(fig["latencies"]) or [math.nan]
    report(
        f"streams (text): first delta, model server -> SSE subscriber, {len(lat)} runs",
        [
            ("p50 (ms)", statistics.median(lat), "target <= 20"),
            ("p90 (ms)", lat[int(len(lat) * 0.9)], ""),
        ],
    )
    results.publish(
        "streams_text",
        __doc__,
        results.Baseline("the same turn with messages.create", plain, "ms per run"),
    )


if __name__ == "__main__":
    main()
