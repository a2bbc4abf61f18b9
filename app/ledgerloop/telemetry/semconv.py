"""Every telemetry name Ledgerloop emits: attributes, span names, metrics, units and buckets.

Targeted conventions: OpenTelemetry GenAI semantic conventions, repository
``open-telemetry/semantic-conventions-genai`` at ``fe5608e`` (2026-08-03), schema
``gen-ai-dev/1.42.0-dev``, stability *development*. Core attributes (``error.type``,
``server.*``, ``network.*``) come from core semantic conventions 1.44 via
``opentelemetry-semantic-conventions`` 0.66b2.

The GenAI names are still moving (the cache-token rename to ``cache_write`` and a new set of
token metrics are in flight upstream), so nothing outside this module spells a name out: when
the target moves, this file and ``SCHEMA_URL`` change together.

Names the installed package has are imported from it. From 0.65b0 on it labels ``gen_ai.*`` and
``mcp.*`` "Deprecated: moved to semantic-conventions-genai" in docstrings only; the string values
are unchanged and importing the string constants raises no warning. We never touch the enum
classes, which *are* decorated ``@deprecated``. Names it lacks are defined here.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai
from opentelemetry.semconv._incubating.attributes import jsonrpc_attributes as _jsonrpc
from opentelemetry.semconv._incubating.attributes import mcp_attributes as _mcp
from opentelemetry.semconv._incubating.attributes import rpc_attributes as _rpc
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as _gen_ai_metrics
from opentelemetry.semconv.attributes import error_attributes as _error
from opentelemetry.semconv.attributes import http_attributes as _http
from opentelemetry.semconv.attributes import network_attributes as _network
from opentelemetry.semconv.attributes import server_attributes as _server
from opentelemetry.semconv.attributes import url_attributes as _url

#: Schema of the targeted GenAI conventions; set on the tracer, meter and logger scopes.
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/gen-ai-dev/1.42.0-dev"
#: Human-readable form of the target, for docs and debugging.
SEMCONV_TARGET: Final = "semantic-conventions-genai@fe5608e (gen-ai-dev/1.42.0-dev)"

#: Instrumentation scope name for Ledgerloop's tracer, meter and logger.
SCOPE_NAME: Final = "ledgerloop"

# --- core (stable)
ERROR_TYPE: Final = _error.ERROR_TYPE
SERVER_ADDRESS: Final = _server.SERVER_ADDRESS
SERVER_PORT: Final = _server.SERVER_PORT
NETWORK_TRANSPORT: Final = _network.NETWORK_TRANSPORT
NETWORK_PROTOCOL_NAME: Final = _network.NETWORK_PROTOCOL_NAME
NETWORK_PROTOCOL_VERSION: Final = _network.NETWORK_PROTOCOL_VERSION
RPC_RESPONSE_STATUS_CODE: Final = _rpc.RPC_RESPONSE_STATUS_CODE
HTTP_REQUEST_METHOD: Final = _http.HTTP_REQUEST_METHOD
HTTP_RESPONSE_STATUS_CODE: Final = _http.HTTP_RESPONSE_STATUS_CODE
HTTP_ROUTE: Final = _http.HTTP_ROUTE
URL_FULL: Final = _url.URL_FULL

# --- gen_ai.* attributes
GEN_AI_OPERATION_NAME: Final = _gen_ai.GEN_AI_OPERATION_NAME
GEN_AI_PROVIDER_NAME: Final = _gen_ai.GEN_AI_PROVIDER_NAME
GEN_AI_AGENT_NAME: Final = _gen_ai.GEN_AI_AGENT_NAME
GEN_AI_CONVERSATION_ID: Final = _gen_ai.GEN_AI_CONVERSATION_ID
GEN_AI_REQUEST_MODEL: Final = _gen_ai.GEN_AI_REQUEST_MODEL
GEN_AI_REQUEST_MAX_TOKENS: Final = _gen_ai.GEN_AI_REQUEST_MAX_TOKENS
GEN_AI_RESPONSE_ID: Final = _gen_ai.GEN_AI_RESPONSE_ID
GEN_AI_RESPONSE_MODEL: Final = _gen_ai.GEN_AI_RESPONSE_MODEL
GEN_AI_RESPONSE_FINISH_REASONS: Final = _gen_ai.GEN_AI_RESPONSE_FINISH_REASONS
GEN_AI_USAGE_INPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_INPUT_TOKENS
GEN_AI_USAGE_OUTPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
# fe5608e still spells it cache_creation; upstream is renaming it to cache_write (#440).
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
GEN_AI_TOKEN_TYPE: Final = _gen_ai.GEN_AI_TOKEN_TYPE
GEN_AI_TOOL_NAME: Final = _gen_ai.GEN_AI_TOOL_NAME
GEN_AI_TOOL_TYPE: Final = _gen_ai.GEN_AI_TOOL_TYPE
GEN_AI_TOOL_CALL_ID: Final = _gen_ai.GEN_AI_TOOL_CALL_ID
GEN_AI_TOOL_DESCRIPTION: Final = _gen_ai.GEN_AI_TOOL_DESCRIPTION
GEN_AI_INPUT_MESSAGES: Final = _gen_ai.GEN_AI_INPUT_MESSAGES
GEN_AI_OUTPUT_MESSAGES: Final = _gen_ai.GEN_AI_OUTPUT_MESSAGES
GEN_AI_SYSTEM_INSTRUCTIONS: Final = _gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS

# Values. Plain strings rather than the package's enum classes, which are marked deprecated.
OPERATION_CHAT: Final = "chat"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
PROVIDER_ANTHROPIC: Final = "anthropic"
TOKEN_TYPE_INPUT: Final = "input"  # noqa: S105 - a token kind, not a secret
TOKEN_TYPE_OUTPUT: Final = "output"  # noqa: S105 - a token kind, not a secret
TOOL_TYPE_FUNCTION: Final = "function"

# --- mcp.* / jsonrpc.* (merged onto the execute_tool span)
MCP_METHOD_NAME: Final = _mcp.MCP_METHOD_NAME
MCP_SESSION_ID: Final = _mcp.MCP_SESSION_ID
MCP_PROTOCOL_VERSION: Final = _mcp.MCP_PROTOCOL_VERSION
JSONRPC_REQUEST_ID: Final = _jsonrpc.JSONRPC_REQUEST_ID
JSONRPC_PROTOCOL_VERSION: Final = _jsonrpc.JSONRPC_PROTOCOL_VERSION
MCP_METHOD_TOOLS_CALL: Final = "tools/call"
#: ``error.type`` the MCP conventions prescribe for a CallToolResult with ``isError: true``.
MCP_TOOL_ERROR: Final = "tool_error"

# --- ledgerloop.* (our own namespace)
LEDGERLOOP_RUN_ID: Final = "ledgerloop.run.id"
LEDGERLOOP_STEP_NAME: Final = "ledgerloop.step.name"
LEDGERLOOP_TENANT_ID: Final = "ledgerloop.tenant.id"
LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY: Final = "ledgerloop.effect.idempotency_key"
LEDGERLOOP_EFFECT_STATUS: Final = "ledgerloop.effect.status"
LEDGERLOOP_APPROVAL_ID: Final = "ledgerloop.approval.id"
#: Set on an execution span whose execution ended by hibernating (the run waits on).
LEDGERLOOP_RUN_HIBERNATED: Final = "ledgerloop.run.hibernated"
#: The run's status when its invoke_agent span ends (succeeded, failed, cancelled).
LEDGERLOOP_RUN_STATUS: Final = "ledgerloop.run.status"
#: Why the run ended (the reason of its last event: succeeded, model_call_failed, ...).
LEDGERLOOP_RUN_REASON: Final = "ledgerloop.run.reason"
#: How an execution ended: completed, hibernated, stopped, failed, interrupted.
LEDGERLOOP_EXECUTION_END: Final = "ledgerloop.execution.end"
#: True on the execution span of a run resumed from its journal (not its first execution).
LEDGERLOOP_EXECUTION_RESUMED: Final = "ledgerloop.execution.resumed"
#: What a wait span waited for: approval, effect.
LEDGERLOOP_WAIT_KIND: Final = "ledgerloop.wait.kind"
#: How long a wait took, in seconds (also the span's duration).
LEDGERLOOP_WAIT_DURATION: Final = "ledgerloop.wait.duration_s"
#: An approval's decision (approved, rejected) or expired, on its wait span.
LEDGERLOOP_APPROVAL_DECISION: Final = "ledgerloop.approval.decision"
#: On a chat span reported for a model call lost with its process: it may have been sent
#: (and billed), but its answer never reached the journal.
LEDGERLOOP_CALL_LOST: Final = "ledgerloop.call.lost"
#: Who settled an effect after its delivery: reconciler, operator.
LEDGERLOOP_EFFECT_SETTLED_BY: Final = "ledgerloop.effect.settled_by"
#: Effect delivery attempt number (relay CLIENT span).
LEDGERLOOP_EFFECT_ATTEMPT: Final = "ledgerloop.effect.attempt"

# error.type values of Ledgerloop's own (low cardinality, as the conventions ask).
#: An execution that ended without a word: its process died (SIGKILL, OOM, power) or was
#: stopped mid-step. Reported by the execution that resumed the run.
ERROR_EXECUTION_INTERRUPTED: Final = "execution_interrupted"
#: A write effect the downstream refused (4xx) or that ran out of attempts.
ERROR_EFFECT_FAILED: Final = "effect_failed"
#: A write effect that needs a person to settle it.
ERROR_EFFECT_NEEDS_HUMAN: Final = "effect_needs_human"
#: A write effect whose outcome is not known yet (sent, no readable answer).
ERROR_EFFECT_OUTCOME_UNKNOWN: Final = "effect_outcome_unknown"
#: Why the sweeper settled a run (workflow_error, workflow_missing, deadline_exceeded...).
LEDGERLOOP_RUN_SWEEP_REASON: Final = "ledgerloop.run.sweep_reason"

# --- span names


def chat_span_name(request_model: str) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``."""
    return f"{OPERATION_CHAT} {request_model}"


def agent_span_name(agent_name: str) -> str:
    """``invoke_agent {gen_ai.agent.name}``, or bare ``invoke_agent`` without a name."""
    return f"{OPERATION_INVOKE_AGENT} {agent_name}" if agent_name else OPERATION_INVOKE_AGENT


def tool_span_name(tool_name: str) -> str:
    """``execute_tool {gen_ai.tool.name}``."""
    return f"{OPERATION_EXECUTE_TOOL} {tool_name}"


def execution_span_name(agent_name: str) -> str:
    """``execution {agent}``: one process's stretch of a run (a run has one or more)."""
    return f"execution {agent_name}" if agent_name else "execution"


def wait_span_name(kind: str, tool_name: str) -> str:
    """``await_approval {tool}`` or ``await_effect {tool}``."""
    return f"await_{kind} {tool_name}"


def reconcile_span_name(tool_name: str) -> str:
    """``reconcile_effect {tool}``: the reconciler settling an effect."""
    return f"reconcile_effect {tool_name}"


# --- events
EVENT_INFERENCE_DETAILS: Final = "gen_ai.client.inference.operation.details"

# --- metrics
METRIC_CLIENT_OPERATION_DURATION: Final = _gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION
METRIC_CLIENT_TOKEN_USAGE: Final = _gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE
# The agent and tool metrics landed in the GenAI repo (#201, #336) after the split, so no
# Python semconv release has them.
METRIC_INVOKE_AGENT_DURATION: Final = "gen_ai.invoke_agent.duration"
METRIC_INVOKE_AGENT_INFERENCE_CALLS: Final = "gen_ai.invoke_agent.inference_calls"
METRIC_INVOKE_AGENT_TOOL_CALLS: Final = "gen_ai.invoke_agent.tool_calls"
METRIC_EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
#: Model turns that produced neither text nor a tool call: paid for, worth nothing.
METRIC_EMPTY_TURNS: Final = "ledgerloop.agent.empty_turns"
#: Model calls lost with their process: possibly sent (and billed), never journaled.
METRIC_LOST_CALLS: Final = "ledgerloop.agent.lost_calls"
#: Runs the sweeper settled because their workflow had ended, vanished or outlived the run.
METRIC_RUNS_SWEPT: Final = "ledgerloop.runs.swept"
#: Ledgerloop's own: what model calls cost by the configured price table (ledgerloop.pricing).
METRIC_MODEL_COST: Final = "ledgerloop.gen_ai.client.cost"
UNIT_USD: Final = "USD"

UNIT_SECONDS: Final = "s"
UNIT_TOKEN: Final = "{token}"  # noqa: S105 - a unit, not a secret
UNIT_INFERENCE_CALL: Final = "{inference_call}"
UNIT_TOOL_CALL: Final = "{tool_call}"
UNIT_TURN: Final = "{turn}"
UNIT_CALL: Final = "{call}"
UNIT_RUN: Final = "{run}"

# The spec's advisory ExplicitBucketBoundaries. The SDK's default buckets (0..10000) would put
# every model call under 10 s into three buckets and every token count into a handful.
BUCKETS_CLIENT_DURATION: Final[tuple[float, ...]] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
BUCKETS_TOKEN_USAGE: Final[tuple[float, ...]] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
BUCKETS_INVOKE_AGENT_DURATION: Final[tuple[float, ...]] = (
    0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6,
)  # fmt: skip
BUCKETS_INVOKE_AGENT_CALLS: Final[tuple[float, ...]] = (1, 2, 4, 8, 16, 32, 64, 128)
BUCKETS_EXECUTE_TOOL_DURATION: Final = BUCKETS_CLIENT_DURATION

# --- content capture switch
ENV_CAPTURE_MESSAGE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
