"""An MCP tool's execute_tool span always has a description: its own, or what and where it is."""

from __future__ import annotations

from ledgerloop.agent.act_mcp import as_tool, describe_tool

DEFINITION = {
    "name": "tickets_create",
    "mcp_name": "create",
    "server": "tickets",
    "description": "",
    "input_schema": {"type": "object"},
    "kind": "write",
    "idempotent": True,
    "lookup_tool": None,
}


def test_a_tool_without_a_description_is_described_by_its_name_and_server() -> None:
    assert (
        describe_tool(DEFINITION) == "create, a tool of MCP server tickets (no description given)"
    )
    assert as_tool(DEFINITION).description == describe_tool(DEFINITION)


def test_a_tool_keeps_its_own_description() -> None:
    given = {**DEFINITION, "description": "  File a ticket.  "}
    assert describe_tool(given) == "File a ticket."
