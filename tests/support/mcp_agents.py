"""Agents whose tools come from MCP servers (the MCP tests write the servers' policy)."""

from __future__ import annotations

from ledgerloop.agent.definition import Agent, register_agent

MCP_HTTP = register_agent(
    Agent(
        name="mcp_http",
        system="Test agent over MCP (HTTP).",
        tools=(),
        mcp_servers=("tickets_http",),
    )
)
MCP_STDIO = register_agent(
    Agent(
        name="mcp_stdio",
        system="Test agent over MCP (stdio).",
        tools=(),
        mcp_servers=("tickets_stdio",),
    )
)
