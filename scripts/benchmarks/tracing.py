"""What tracing costs per turn: whole two-turn runs with SDK tracing (spans, metrics, batch
export to a discarding exporter) against the same runs with telemetry off, interleaved.
Target: <= 5% per turn.

Two measures: wall time, and this process's CPU time (all its threads: the workflow, DBOS's
pool, the span exporter's). On a shared, loaded machine the wall time of either side swings
by more than the overhead; tracing's cost is client CPU, which the CPU time isolates."""

from __future__ import annotations

import time
from typing import Any

from dbos import SetWorkflowID
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ledgerloop.agent.loop import ledgerloop_run
from ledgerloop.runs.store import run_create
from ledgerloop.runtime import Runtime
from ledgerloop.telemetry.spans import Telemetry, set_telemetry
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

RUNS = int(size("BENCH_TRACING_RUNS", "100", "2"))
TURNS = 2


class Discard(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def measure(runtime: Runtime) -> dict[str, Any]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    on = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    off = Telemetry()  # the API's no-op providers

    async def one_run() -> None:
        with runtime.pool.connection() as conn:
            run, _ = run_create(conn, agent="ops", input={"message": "disk full"})
        with SetWorkflowID(str(run.id)):
            await ledgerloop_run(str(run.id))

    samples: dict[str, list[float]] = {"off": [], "on": [], "off_cpu": [], "on_cpu": []}
    for i in range(RUNS + 2):
        for mode, tel in (("off", off), ("on", on)):
            set_telemetry(tel)
            cpu = time.process_time()
            elapsed = await timed(one_run)
            cpu = time.process_time() - cpu
            if i >= 2:  # warm-up
                samples[mode].append(elapsed)
                samples[f"{mode}_cpu"].append(cpu)
    set_telemetry(None)
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return {k: per_unit_ms(v, TURNS) for k, v in samples.items()}


def main() -> None:
    script = """
default:
  turns:
    - tool_use: {name: search_kb, input: {query: disk}}
    - text: done
"""
    with database() as url, scripted(script) as model:
        result = run_in_worker(settings_for(url, model.url), url, measure)
    overhead = (result["on"] / result["off"] - 1) * 100
    cpu_overhead = (result["on_cpu"] / result["off_cpu"] - 1) * 100
    report(
        f"tracing ({RUNS} two-turn runs each way, median ms per turn)",
        [
            ("turn with telemetry off", result["off"], "baseline"),
            ("turn with spans + metrics on", result["on"], f"{overhead:+.1f}% (target <= 5%)"),
            ("turn CPU with telemetry off", result["off_cpu"], "baseline"),
            ("turn CPU with spans + metrics on", result["on_cpu"], f"{cpu_overhead:+.1f}%"),
        ],
    )
    publish("tracing", __doc__, Baseline("a turn with telemetry off", result["off"], "ms"))


if __name__ == "__main__":
    main()
