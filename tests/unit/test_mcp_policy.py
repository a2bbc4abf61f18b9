"""MCP servers in tool_policy.yaml: checked when the worker starts, with one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.support.mcp_agents  # noqa: F401 - registers the agents under test
from ledgerloop.errors import ConfigError
from ledgerloop.tools.policy import load_policy
from ledgerloop.worker import check_mcp_servers

MODULES = ("tests.support.mcp_agents",)


def test_an_agents_unconfigured_server_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: '1'\n")
    with pytest.raises(ConfigError, match=r"uses MCP server 'tickets_http'.*mcp_servers\."):
        check_mcp_servers(load_policy(path), MODULES)


def test_a_lookup_tool_must_be_a_declared_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: '1'\nmcp_servers:\n"
        "  tickets_http: {transport: streamable_http, url: 'http://127.0.0.1:9/mcp',"
        " write_tools: {create_ticket: {lookup_tool: find}}}\n"
        "  tickets_stdio: {transport: stdio, command: [x]}\n"
    )
    with pytest.raises(ConfigError, match="lookup_tool 'find' is not one of the server's read"):
        check_mcp_servers(load_policy(path), MODULES)


def test_a_server_without_its_address_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: '1'\nmcp_servers:\n  s: {transport: stdio}\n")
    with pytest.raises(ConfigError, match="needs a command"):
        load_policy(path)
