"""A second agent over MCP (HTTP) whose server, `tickets_other`, exposes the same tool names
as `tickets_http`'s. A module of its own: a worker checks that every agent of its modules has
its servers in the policy, and only the test of two such agents configures this one."""

from __future__ import annotations

from ledgerloop.agent.definition import Agent, register_agent

MCP_HTTP_OTHER = register_agent(
    Agent(
        name="mcp_http_other",
        system="Test agent over MCP (HTTP, another server).",
        tools=(),
        mcp_servers=("tickets_other",),
    )
)
