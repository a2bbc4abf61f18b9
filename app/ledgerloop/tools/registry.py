"""Tools as the model sees them (name, description, JSON schema) and as Ledgerloop runs them.

A read tool runs inline in its step. A write tool is a declared HTTP effect: the step only
records the effect and its outbox row, and the relay delivers it with an idempotency key.
A sandbox tool runs a command in an isolated sandbox (ledgerloop.sandbox).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel


class ToolKind(StrEnum):
    READ = "read"
    WRITE = "write"
    SANDBOX = "sandbox"


@dataclass(frozen=True)
class ToolContext:
    """What a tool handler may know about the call."""

    run_id: str
    tool_call_id: str
    tenant_id: str
    idempotency_key: str


@dataclass(frozen=True)
class HttpEffect:
    """How the relay delivers a write tool's effect, and how the reconciler checks on it.

    `lookup_path` is a template with `{key}` (the idempotency key); `honours_idempotency` says
    whether a resend with the same key is safe. Neither means an unknown outcome needs a human.
    """

    destination: str
    method: str
    path: str
    honours_idempotency: bool = False
    lookup_path: str | None = None
    compensate_path: str | None = None


@dataclass(frozen=True)
class SandboxCommand:
    """What a sandbox tool runs: files written into /work first, then argv there."""

    argv: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class McpEffect:
    """A write tool of an MCP server, delivered by the relay as tools/call (docs/mcp.md)."""

    destination: str  # the MCP server's name
    tool: str
    honours_idempotency: bool = False
    lookup_tool: str | None = None
    compensate_path: None = None


ReadHandler = Callable[[Any, ToolContext], Awaitable[Any]]
BodyBuilder = Callable[[Any], dict[str, Any]]
CommandBuilder = Callable[[Any], SandboxCommand]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_model: type[BaseModel]
    kind: ToolKind
    handler: ReadHandler | None = None
    effect: HttpEffect | McpEffect | None = None
    body: BodyBuilder | None = None
    preview: Callable[[Any], str] | None = field(default=None)
    command: CommandBuilder | None = None

    def schema(self) -> dict[str, Any]:
        """The tool definition in the Messages API's format (read-only: it is shared)."""
        return _definition(self.name, self.description, self.input_model)


@functools.cache
def _definition(name: str, description: str, input_model: type[BaseModel]) -> dict[str, Any]:
    # Every model request carries every tool's definition, and building a JSON schema costs
    # about a millisecond of CPU: once per tool, not once per turn.
    return {
        "name": name,
        "description": description,
        "input_schema": input_model.model_json_schema(),
    }


def read_tool(
    name: str, description: str, input_model: type[BaseModel]
) -> Callable[[ReadHandler], Tool]:
    """Decorate an async `handler(args, ctx)` into a read tool."""

    def wrap(handler: ReadHandler) -> Tool:
        return Tool(name, description, input_model, ToolKind.READ, handler=handler)

    return wrap


def write_tool(
    name: str,
    description: str,
    input_model: type[BaseModel],
    effect: HttpEffect,
    *,
    preview: Callable[[Any], str] | None = None,
) -> Callable[[BodyBuilder], Tool]:
    """Decorate `body(args) -> JSON body` into a write tool delivered as `effect`."""

    def wrap(body: BodyBuilder) -> Tool:
        return Tool(
            name,
            description,
            input_model,
            ToolKind.WRITE,
            effect=effect,
            body=body,
            preview=preview,
        )

    return wrap


def sandbox_tool(
    name: str, description: str, input_model: type[BaseModel]
) -> Callable[[CommandBuilder], Tool]:
    """Decorate `command(args) -> SandboxCommand` into a tool that runs in a sandbox.

    The policy names the backend, limits and files (tool_policy.yaml); the code only says
    what to run.
    """

    def wrap(command: CommandBuilder) -> Tool:
        return Tool(name, description, input_model, ToolKind.SANDBOX, command=command)

    return wrap
