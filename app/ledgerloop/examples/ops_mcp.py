"""The ops agent with its ticket system over MCP instead of HTTP.

Same runbook search; tickets come from the MCP server `tickets_mcp` (tool_policy.yaml), the
example in ledgerloop.examples.mcp_ticket_server. `create_ticket` is declared a write tool
that honours idempotency keys (with `find_ticket_by_key` as its lookup) and needs approval,
so it goes through the outbox exactly like the HTTP `write_ticket`. Load it with
LEDGERLOOP_AGENT_MODULES=ledgerloop.examples.ops_mcp.
"""

from __future__ import annotations

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.examples.ops_agent import search_kb

OPS_MCP_AGENT = register_agent(
    Agent(
        name="ops_mcp",
        system=(
            "You are an operations assistant. Search the runbooks before acting. File a "
            "ticket with create_ticket only when a human needs to act."
        ),
        tools=(search_kb,),
        mcp_servers=("tickets_mcp",),
    )
)
