"""MCP tools: connections to MCP servers (official `mcp` SDK), calls and their verdicts,
and the merge of the SDK's client span into execute_tool (docs/mcp.md)."""
