"""The GenAI metric instruments, created lazily from one Meter.

Lazy so that building a ``Telemetry`` costs nothing until a run records something, and so that
a test can hand in a MeterProvider with an InMemoryMetricReader before the first instrument
exists. Every histogram carries the spec's advisory bucket boundaries: the Python
``create_*`` helpers in opentelemetry-semantic-conventions do not pass them.
"""

from __future__ import annotations

from functools import cached_property

from opentelemetry.metrics import Counter, Histogram, Meter

from ledgerloop.telemetry import semconv as sc


class Instruments:
    """Histograms and counters for one Meter. Attribute sets are the caller's job (spans.py)."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter

    def _histogram(
        self, name: str, unit: str, description: str, buckets: tuple[float, ...]
    ) -> Histogram:
        return self._meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=list(buckets),
        )

    @cached_property
    def client_operation_duration(self) -> Histogram:
        return self._histogram(
            sc.METRIC_CLIENT_OPERATION_DURATION,
            sc.UNIT_SECONDS,
            "GenAI operation duration.",
            sc.BUCKETS_CLIENT_DURATION,
        )

    @cached_property
    def client_token_usage(self) -> Histogram:
        return self._histogram(
            sc.METRIC_CLIENT_TOKEN_USAGE,
            sc.UNIT_TOKEN,
            "Number of input and output tokens used.",
            sc.BUCKETS_TOKEN_USAGE,
        )

    @cached_property
    def invoke_agent_duration(self) -> Histogram:
        return self._histogram(
            sc.METRIC_INVOKE_AGENT_DURATION,
            sc.UNIT_SECONDS,
            "Duration of one agent invocation.",
            sc.BUCKETS_INVOKE_AGENT_DURATION,
        )

    @cached_property
    def invoke_agent_inference_calls(self) -> Histogram:
        return self._histogram(
            sc.METRIC_INVOKE_AGENT_INFERENCE_CALLS,
            sc.UNIT_INFERENCE_CALL,
            "Model calls made by one agent invocation, failed ones included.",
            sc.BUCKETS_INVOKE_AGENT_CALLS,
        )

    @cached_property
    def invoke_agent_tool_calls(self) -> Histogram:
        return self._histogram(
            sc.METRIC_INVOKE_AGENT_TOOL_CALLS,
            sc.UNIT_TOOL_CALL,
            "Client-side tool calls made by one agent invocation.",
            sc.BUCKETS_INVOKE_AGENT_CALLS,
        )

    @cached_property
    def execute_tool_duration(self) -> Histogram:
        return self._histogram(
            sc.METRIC_EXECUTE_TOOL_DURATION,
            sc.UNIT_SECONDS,
            "Duration of one tool execution.",
            sc.BUCKETS_EXECUTE_TOOL_DURATION,
        )

    @cached_property
    def empty_turns(self) -> Counter:
        return self._meter.create_counter(
            sc.METRIC_EMPTY_TURNS,
            unit=sc.UNIT_TURN,
            description="Model turns with neither text nor a tool call.",
        )

    @cached_property
    def lost_calls(self) -> Counter:
        return self._meter.create_counter(
            sc.METRIC_LOST_CALLS,
            unit=sc.UNIT_CALL,
            description="Model calls lost with their process: possibly sent, never journaled.",
        )

    @cached_property
    def runs_swept(self) -> Counter:
        return self._meter.create_counter(
            sc.METRIC_RUNS_SWEPT,
            unit=sc.UNIT_RUN,
            description="Unfinished runs the sweeper settled (their workflow ended without them).",
        )

    @cached_property
    def model_cost(self) -> Counter:
        return self._meter.create_counter(
            sc.METRIC_MODEL_COST,
            unit=sc.UNIT_USD,
            description="What model calls cost by the configured price table (priced models only).",
        )
