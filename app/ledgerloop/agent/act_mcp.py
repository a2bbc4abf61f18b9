"""MCP tools in the loop: discovered once per run, read tools inline, write tools as effects.

    mcp-discover               tools/list on each of the agent's MCP servers    (a step)
    tool-{i}-{call_id}         a read tool: tools/call inside the step          (a step)
                               a write tool: the write path (act_write), the relay calls it

The discovered list is the step's result, so a replay (or a resume after a crash) sees the
same tools in the same order as the first execution, whatever the server lists by then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from ledgerloop.agent import steps
from ledgerloop.agent.definition import get_agent
from ledgerloop.agent.keep import keep
from ledgerloop.agent.stepping import db_call
from ledgerloop.agent.steps import tool_result
from ledgerloop.effects.delivery import Verdict
from ledgerloop.mcptools.calls import call_tool, list_tools
from ledgerloop.mcptools.client import McpConnection, McpUnreachable, connections
from ledgerloop.mcptools.spans import call_facts, merge_sdk_spans
from ledgerloop.runs.states import RunStatus
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry import McpCall, tool_span
from ledgerloop.telemetry import semconv as sc
from ledgerloop.tools.payloads import offload_if_large
from ledgerloop.tools.registry import McpEffect, Tool, ToolKind

log = logging.getLogger(__name__)


class McpArguments(BaseModel):
    """Arguments of an MCP tool: the server validates them against its own schema."""

    model_config = ConfigDict(extra="allow")


def as_tool(definition: dict[str, Any]) -> Tool:
    """A discovered MCP write tool as the write path runs it.

    Built from the run's own journaled definition every time, never from a registry by name:
    two agents in one worker may each discover a tool of one name on different servers.
    """
    return Tool(
        name=definition["name"],
        description=describe_tool(definition),
        input_model=McpArguments,
        kind=ToolKind.WRITE,
        effect=McpEffect(
            destination=definition["server"],
            tool=definition["mcp_name"],
            honours_idempotency=definition["idempotent"],
            lookup_tool=definition["lookup_tool"],
        ),
        body=lambda args: args.model_dump(),
    )


def describe_tool(definition: dict[str, Any]) -> str:
    """The tool's own description, or (a server that gave none) what it is and where: every
    execute_tool span has a gen_ai.tool.description."""
    given = str(definition.get("description") or "").strip()
    if given:
        return given
    name = definition.get("mcp_name") or definition["name"]
    return f"{name}, a tool of MCP server {definition.get('server', '?')} (no description given)"


def register_discovered(definitions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Workflow code, on every execution: the journaled list becomes this run's MCP tools,
    by name (unique within the run: discovery skips a name already taken)."""
    return {definition["name"]: definition for definition in definitions}


def definition_for(tools: dict[str, dict[str, Any]], tool: Tool) -> dict[str, Any] | None:
    """The run's journaled definition of `tool` when it is one of the run's MCP tools: the
    write steps rebuild the tool from it rather than look it up by name."""
    return tools.get(tool.name) if isinstance(tool.effect, McpEffect) else None


def schema_of(definition: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": definition["name"],
        "description": definition["description"],
        "input_schema": definition["input_schema"],
    }


def mcp_call_facts(tool: Tool, connection: McpConnection | None = None) -> McpCall | None:
    """The MCP attributes of a tool call's execute_tool span (None: not an MCP tool)."""
    if not isinstance(tool.effect, McpEffect):
        return None
    server = get_runtime().policy.mcp_servers.get(tool.effect.destination)
    return call_facts(server, connection)


# -- step bodies ----------------------------------------------------------------------------


async def discover(agent_name: str) -> dict[str, Any]:
    """tools/list on each of the agent's servers. A server that cannot answer contributes no
    tools (the result says why) rather than failing the run."""
    merge_sdk_spans()
    rt = get_runtime()
    agent = get_agent(agent_name)
    assert agent is not None
    local = {tool.name for tool in agent.tools}
    found: list[dict[str, Any]] = []
    unavailable: dict[str, str] = {}
    for name in agent.mcp_servers:
        server = rt.policy.mcp_servers.get(name)
        if server is None:
            unavailable[name] = f"MCP server {name} is not configured in the tool policy"
            continue
        try:
            listed = await list_tools(connections(), name, server)
        except McpUnreachable as exc:
            log.warning("%s", exc)
            unavailable[name] = str(exc)
            continue
        for tool in listed:
            if tool["name"] in local or any(f["name"] == tool["name"] for f in found):
                unavailable[f"{name}/{tool['name']}"] = "name taken by another tool; skipped"
                continue
            write = server.write_tools.get(tool["name"])
            read = tool["name"] in server.read_tools
            found.append(
                {
                    **tool,
                    "server": name,
                    "mcp_name": tool["name"],
                    "kind": (ToolKind.READ if read else ToolKind.WRITE).value,
                    "idempotent": bool(write and write.idempotent),
                    "lookup_tool": write.lookup_tool if write else None,
                }
            )
    return {"tools": found, "unavailable": unavailable}


async def run_mcp_read(
    run_id: str, tenant_id: str, step_name: str, definition: dict[str, Any], call: dict[str, Any]
) -> dict[str, Any]:
    """A read tool: tools/call inside this step, its result (offloaded when large) back."""
    merge_sdk_spans()
    rt = get_runtime()
    call_id, name = str(call["id"]), str(call["name"])
    server_name = definition["server"]
    server = rt.policy.mcp_servers.get(server_name)
    if server is None:
        # The policy changed since this run discovered the tool (a deploy).
        text = f"{name} failed: MCP server {server_name} is no longer configured"
        return tool_result(call_id, text, is_error=True)
    await asyncio.to_thread(
        steps.transition,
        run_id,
        RunStatus.EXECUTING.value,
        "executing",
        {"tool_call_id": call_id},
        step_name,  # one event per call, also when the run is already executing
    )
    pool = connections()
    connection: McpConnection | None = None
    unreachable = None
    try:
        connection = await pool.get(server_name, server)
    except McpUnreachable as exc:
        unreachable = str(exc)
    facts = call_facts(server, connection)
    with tool_span(
        name,
        call_id,
        run_id=run_id,
        step_name=step_name,
        mcp=facts,
        description=describe_tool(definition),
    ) as span:
        if unreachable is not None:
            span.record_error("McpUnreachable", unreachable)
            return tool_result(call_id, f"{name} failed: {unreachable}", is_error=True)
        arguments = call.get("input") or {}
        if not isinstance(arguments, dict):
            span.record_error("InvalidArguments", "arguments are not an object")
            return tool_result(call_id, f"arguments for {name} must be an object", is_error=True)

        async def read() -> Any:
            first = await call_tool(
                pool, server_name, server, definition["mcp_name"], arguments, connection=connection
            )
            if first.delivery.verdict is not Verdict.UNKNOWN:
                return first
            # A read changes nothing: one more try on a fresh connection (the pooled one may
            # have outlived its server).
            return await call_tool(pool, server_name, server, definition["mcp_name"], arguments)

        # Kept for a retry of this step (agent.keep): the offload after it failing on a
        # transient database error does not call the server again.
        outcome = await keep(f"mcp read {call_id}", read)
        delivery = outcome.delivery
        if delivery.verdict is not Verdict.SUCCEEDED:
            error_type = "McpError"
            if delivery.verdict is Verdict.FAILED and outcome.rpc_code is None:
                error_type = sc.MCP_TOOL_ERROR
            elif outcome.rpc_code is not None:
                error_type = str(outcome.rpc_code)
            span.record_error(error_type, delivery.detail, rpc_status_code=outcome.rpc_code)
            return tool_result(call_id, f"{name} failed: {delivery.detail}", is_error=True)
        value = delivery.result
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        offloaded = await db_call(
            offload_if_large,
            text,
            limit_bytes=rt.settings.payload_offload_bytes,
            run_id=uuid.UUID(run_id),
            tenant_id=uuid.UUID(tenant_id),
            tool_call_id=call_id,
        )
        result = tool_result(call_id, offloaded.visible)
        if offloaded.payload_id:
            result["payload_ref"] = offloaded.payload_id
        return result
