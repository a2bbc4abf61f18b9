"""One MCP tools/call and what its answer (or its silence) proves; tools/list for discovery.

The same verdicts as an HTTP delivery (ledgerloop.effects.delivery), so the relay and the
reconciler treat an MCP write exactly as an HTTP one:

| what happened                                              | verdict   |
| ---------------------------------------------------------- | --------- |
| a result                                                   | succeeded |
| no connection (spawn failed, refused, no handshake)        | retry     |
| no such tool / invalid params (the server's refusal)       | failed    |
| a result with isError                                      | failed    |
| no answer in time, connection lost, garbage, other errors  | unknown   |

Parse error and invalid request are not refusals here: the SDK's HTTP client makes them up
itself for an answer it cannot read (a body that is not JSON, an unexpected content type, a
202 to a request), which comes after the server may have run the call.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND

from ledgerloop.effects.delivery import (
    Delivery,
    Lookup,
    LookupAnswer,
    Verdict,
    _is_empty_listing,
    _matches,
    reference_of,
)
from ledgerloop.mcptools.client import (
    META_IDEMPOTENCY_KEY,
    McpConnection,
    McpConnections,
    McpUnreachable,
    describe,
)
from ledgerloop.tools.policy import McpServer

#: Errors a server returns before running anything: the same call cannot succeed later.
#: (Parse error and invalid request are left out: the SDK also reports an answer it could
#: not read with them, after the call may have run; see the table above.)
REFUSALS = frozenset({METHOD_NOT_FOUND, INVALID_PARAMS})


@dataclass(frozen=True)
class McpOutcome:
    delivery: Delivery
    #: The connection the call went over (None when none could be made): span attributes.
    connection: McpConnection | None
    rpc_code: int | None = None


def _text(content: Any) -> str:
    parts = []
    for block in content or []:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
    return "\n".join(parts)


def result_value(result: Any) -> Any:
    """What a tool returned: its structured content, else its text (parsed when JSON)."""
    if result.structured_content is not None:
        return result.structured_content
    text = _text(result.content)
    try:
        return json.loads(text)
    except ValueError:
        return text


async def call_tool(
    pool: McpConnections,
    name: str,
    server: McpServer,
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str | None = None,
    connection: McpConnection | None = None,
) -> McpOutcome:
    """tools/call with `key` in `_meta`; never raises for the server's or the network's trouble."""
    where = f"tools/call {tool} on MCP server {name}"
    if connection is None:
        try:
            connection = await pool.get(name, server)
        except McpUnreachable as exc:
            return McpOutcome(Delivery(Verdict.RETRY, f"{exc} (nothing was sent)"), None)
    assert connection.client is not None
    meta = {META_IDEMPOTENCY_KEY: key} if key is not None else None
    try:
        async with asyncio.timeout(server.timeout_s):
            result = await connection.client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
    except TimeoutError:
        await pool.discard(name)
        detail = f"no answer to {where} within {server.timeout_s:g}s after sending"
        return McpOutcome(Delivery(Verdict.UNKNOWN, detail), connection)
    except MCPError as exc:
        if exc.code in REFUSALS:
            detail = f"{where} refused: JSON-RPC error {exc.code}: {exc.message}"
            return McpOutcome(Delivery(Verdict.FAILED, detail), connection, exc.code)
        await pool.discard(name)
        detail = f"{where}: JSON-RPC error {exc.code} after sending: {exc.message}"
        return McpOutcome(Delivery(Verdict.UNKNOWN, detail), connection, exc.code)
    except Exception as exc:
        # Anything else (a lost connection, an answer the SDK could not read) came after the
        # request may have reached the server.
        await pool.discard(name)
        detail = f"{where} failed after sending: {describe(exc)}"
        return McpOutcome(Delivery(Verdict.UNKNOWN, detail), connection)
    if result.is_error:
        detail = f"{where} returned an error: {_text(result.content)[:500]}"
        return McpOutcome(Delivery(Verdict.FAILED, detail), connection)
    value = result_value(result)
    return McpOutcome(
        Delivery(Verdict.SUCCEEDED, result=value, external_reference=reference_of(value)),
        connection,
    )


async def list_tools(pool: McpConnections, name: str, server: McpServer) -> list[dict[str, Any]]:
    """The server's tools as name, description and input schema (raises McpUnreachable)."""
    connection = await pool.get(name, server)
    assert connection.client is not None
    try:
        async with asyncio.timeout(server.timeout_s):
            listed = await connection.client.list_tools()
    except Exception as exc:
        await pool.discard(name)
        raise McpUnreachable(f"tools/list on MCP server {name} failed: {describe(exc)}") from exc
    return [
        {
            "name": tool.name,
            "description": tool.description or "",
            "input_schema": tool.input_schema,
        }
        for tool in listed.tools
    ]


async def mcp_lookup(
    pool: McpConnections, name: str, server: McpServer, tool: str, key: str
) -> LookupAnswer:
    """Ask the server's lookup tool what `key` created (the reconciler's question)."""
    outcome = await call_tool(pool, name, server, tool, {"idempotency_key": key})
    delivery = outcome.delivery
    where = f"tools/call {tool} on MCP server {name}"
    if delivery.verdict in (Verdict.RETRY, Verdict.UNKNOWN):
        return LookupAnswer(Lookup.TRANSIENT, delivery.detail)
    if delivery.verdict is Verdict.FAILED:
        return LookupAnswer(Lookup.UNEXPECTED, delivery.detail)
    found = _matches(delivery.result)
    if found:
        return LookupAnswer(Lookup.FOUND, f"{where} found {len(found)}", None, tuple(found))
    if _is_empty_listing(delivery.result):
        return LookupAnswer(Lookup.ABSENT, f"{where} found nothing")
    return LookupAnswer(Lookup.UNEXPECTED, f"{where}: no id in the answer {delivery.result!r}")
