"""tool_policy.yaml: per-tool rules, validated once at start-up.

A bad file fails with its path and the offending field; nothing about a tool's safety is
decided by a prompt. The rules fail closed: an unknown field is refused, not ignored, and a
write tool the file does not name keeps the worker from starting (see `missing_write_tools`);
were one to run anyway, it would need an approval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ledgerloop.errors import ConfigError
from ledgerloop.tools.conditions import (
    Condition,
    ConditionError,
    Undecidable,
    parse_condition,
)
from ledgerloop.tools.policy_lines import PolicyLines
from ledgerloop.tools.templates import Template, parse_template


class OnReject(StrEnum):
    CONTINUE = "continue"  # tell the model "rejected" as an error tool result and go on
    CANCEL = "cancel"  # cancel the run


class OnTimeout(StrEnum):
    CANCEL = "cancel"
    KEEP_WAITING = "keep_waiting"


class SandboxLimits(BaseModel):
    """What one command of a sandbox tool may use; each is enforced (docs/sandbox.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time_s: float = Field(default=30, gt=0, le=3600)
    memory_mb: int = Field(default=512, ge=32, le=65536)
    output_kb: int = Field(default=1024, ge=1, le=102_400)
    processes: int = Field(default=64, ge=4, le=4096)
    file_mb: int = Field(default=64, ge=1, le=65536)
    #: How much of its working directory a run may keep while it waits (an offloaded payload).
    snapshot_mb: int = Field(default=16, ge=1, le=1024)


#: The fields that mean something for sandbox tools only.
SANDBOX_FIELDS = frozenset({"sandbox", "limits", "files_in", "files_out", "read_only_paths"})


class ApprovalRule(BaseModel):
    """`requires_approval: {when: CONDITION}`: an approval only for calls whose arguments
    meet the condition (the language: ledgerloop.tools.conditions, docs/policy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The condition, as written in the file (kept for the record and the docs).
    when: dict[str, Any]
    _condition: Condition = PrivateAttr()

    @field_validator("when", mode="before")
    @classmethod
    def _parse(cls, value: object) -> object:
        parse_condition(value)  # raises ConditionError naming the place inside it
        return value

    def model_post_init(self, context: Any, /) -> None:
        self._condition = parse_condition(self.when)

    @property
    def condition(self) -> Condition:
        return self._condition


class ToolPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: true, false, or {when: CONDITION} on the tool's arguments.
    requires_approval: bool | ApprovalRule = False
    #: The approver's one-line summary: a template over the tool's arguments,
    #: "Refund {amount_cents} cents to {customer}" (ledgerloop.tools.templates).
    summary: str | None = Field(default=None, min_length=1, max_length=500)
    approver_roles: tuple[str, ...] = ("approver",)
    approval_ttl_s: float = Field(default=8 * 3600, gt=0)
    on_reject: OnReject = OnReject.CONTINUE
    on_timeout: OnTimeout = OnTimeout.CANCEL
    idempotency_header: str = "Idempotency-Key"
    timeout_ms: int = Field(default=10_000, gt=0, le=600_000)
    max_retries: int = Field(default=2, ge=0, le=10)
    deadline_s: float = Field(default=300, gt=0)
    cache_ttl_s: float = Field(default=0, ge=0)
    #: Sandbox tools only. Unset: gvisor. Egress is always denied (no allow-list yet).
    sandbox: Literal["gvisor", "bwrap"] | None = None
    network: Literal["default-deny"] = "default-deny"
    limits: SandboxLimits = SandboxLimits()
    #: File name in the working directory -> host file copied there when the sandbox is made.
    files_in: dict[str, str] = Field(default_factory=dict)
    #: Patterns (fnmatch, relative to the working directory) of files returned after a command.
    files_out: tuple[str, ...] = ()
    #: Host paths the guest sees read-only at the same place (besides /usr).
    read_only_paths: tuple[str, ...] = ()

    @field_validator("requires_approval", mode="before")
    @classmethod
    def _rule(cls, value: object) -> object:
        # One clear error for a bad rule (a plain union would report both of its branches).
        if isinstance(value, bool):
            return value
        if not isinstance(value, Mapping):
            raise ConditionError("", "requires_approval is true, false or {when: CONDITION}")
        try:
            return ApprovalRule.model_validate(value)
        except ValidationError as exc:
            where, message = describe_error(exc)
            raise ConditionError(where, message) from None

    @field_validator("summary")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            parse_template(value)  # raises ConditionError saying what to write instead
        return value

    @property
    def sandbox_backend(self) -> str:
        return self.sandbox or "gvisor"

    @property
    def summary_template(self) -> Template | None:
        return parse_template(self.summary) if self.summary else None

    @property
    def may_require_approval(self) -> bool:
        """Whether some call of the tool may need an approval (then the run asks its
        approval step, which decides for the call's arguments)."""
        return self.requires_approval is not False

    def approval_needed(self, arguments: Mapping[str, Any]) -> tuple[bool, str]:
        """Whether a call with these (validated, JSON-ready) arguments needs an approval, and
        why. A condition that cannot be decided asks for one: the rules fail closed."""
        rule = self.requires_approval
        if isinstance(rule, bool):
            return rule, "requires_approval: true" if rule else "requires_approval: false"
        try:
            needed = rule.condition.holds(arguments)
        except Undecidable as exc:
            return True, f"the condition cannot be decided ({exc}); asking a person"
        return needed, f"the condition is {'met' if needed else 'not met'}"


DEFAULT_POLICY = ToolPolicy()
#: What a write tool the file does not name would run under: fail closed.
UNLISTED_WRITE_POLICY = ToolPolicy(requires_approval=True)


class McpWriteTool(BaseModel):
    """How an MCP write tool behaves when its outcome is unknown (see docs/mcp.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The server returns the original result for a repeated idempotency key in `_meta`.
    idempotent: bool = False
    #: A read tool of the same server that, called with {"idempotency_key": key}, returns
    #: what the key created (an object with an id, or a list of them; empty: nothing).
    lookup_tool: str | None = None


class McpServer(BaseModel):
    """An MCP server agents may use: how to reach it, and what each of its tools is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["stdio", "streamable_http"]
    #: stdio: the command and its arguments; "{python}" is this interpreter.
    command: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    #: streamable_http: the endpoint.
    url: str | None = None
    #: Tools called inline in their step (no outbox): they must not change anything.
    read_tools: tuple[str, ...] = ()
    #: Tools delivered as effects through the outbox. A tool listed in neither is a write
    #: with no idempotency and no lookup: its unknown outcomes go to a person.
    write_tools: dict[str, McpWriteTool] = Field(default_factory=dict)
    timeout_s: float = Field(default=10.0, gt=0, le=600)

    @model_validator(mode="after")
    def _reachable(self) -> McpServer:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs a command")
        if self.transport == "streamable_http" and not self.url:
            raise ValueError("a streamable_http MCP server needs a url")
        return self


class Destination(BaseModel):
    """Where write tools deliver, and how that downstream behaves when an outcome is unknown:
    the one place that says whether a resend is safe, how to ask what a key created, and how
    an effect is undone. A field left unset falls back to what the tool's code declares
    (HttpEffect), then to the default; see docs/policy.md, "Destinations"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://\S+$")
    #: The header that carries the idempotency key on every call.
    idempotency_header: str | None = Field(default=None, min_length=1)
    #: A repeat with the same key returns the original result: a resend is always safe.
    honours_idempotency: bool | None = None
    #: GET path answering what a key created (200 and an id, or 404 nothing); has `{key}`.
    lookup_path: str | None = Field(default=None, pattern=r"^/.*\{key\}")
    #: POST path that undoes a succeeded effect; may use `{ref}` (the downstream's reference)
    #: and `{key}`.
    compensate_path: str | None = Field(default=None, pattern=r"^/")

    @field_validator("compensate_path")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.format(ref="r", key="k")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"{value!r} may use only {{ref}} and {{key}}") from exc
        return value


class EffectFacts(BaseModel):
    """How one write tool's effects are delivered and settled, once the policy's destination
    entry, the tool's policy entry and its code are taken together."""

    model_config = ConfigDict(frozen=True)

    idempotency_header: str
    honours_idempotency: bool
    lookup_path: str | None
    compensate_path: str | None


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1)
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    #: Destination name -> a base URL, or a Destination mapping (url plus its behaviour).
    destinations: dict[str, Destination] = Field(default_factory=dict)
    #: MCP servers by name (the name is also the destination of their write effects).
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)

    #: Where each place is written (load_policy sets it; None for a policy made in code).
    _lines: PolicyLines | None = PrivateAttr(default=None)

    def line_of(self, where: str) -> int | None:
        """The file's line of a place (`tools.refund.summary`), when it was read from one."""
        return self._lines.line(where) if self._lines is not None else None

    def at(self, policy_file: object, where: str) -> str:
        """`FILE:LINE: WHERE`, the way errors name a place of the file (no line: `FILE`)."""
        line = self.line_of(where)
        return f"{policy_file}:{line}: {where}" if line else f"{policy_file}: {where}"

    @field_validator("destinations", mode="before")
    @classmethod
    def _plain_urls(cls, value: object) -> object:
        # `tickets: http://...` stays valid: a destination with nothing more to say.
        if isinstance(value, Mapping):
            return {k: {"url": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    def destination_urls(self) -> dict[str, str]:
        return {name: d.url for name, d in self.destinations.items()}

    def effect_facts(
        self,
        destination: str,
        rules: ToolPolicy,
        *,
        honours_idempotency: bool = False,
        lookup_path: str | None = None,
        compensate_path: str | None = None,
    ) -> EffectFacts:
        """What applies to an effect to `destination` of a tool with these `rules`, given
        what its code declares (the keyword arguments). Each field: the destination's entry
        when it says, else the code's (for the header: the tool's entry), else the default."""
        entry = self.destinations.get(destination)

        def pick(field: str, declared: Any) -> Any:
            said = getattr(entry, field) if entry is not None else None
            return declared if said is None else said

        return EffectFacts(
            idempotency_header=pick("idempotency_header", rules.idempotency_header),
            honours_idempotency=pick("honours_idempotency", honours_idempotency),
            lookup_path=pick("lookup_path", lookup_path),
            compensate_path=pick("compensate_path", compensate_path),
        )

    def for_tool(self, name: str) -> ToolPolicy:
        """A read or sandbox tool's rules; an unlisted one gets the defaults."""
        return self.tools.get(name, DEFAULT_POLICY)

    def for_write_tool(self, name: str) -> ToolPolicy:
        """A write tool's rules; an unlisted one (the worker refuses to start with one, so
        only an agent registered later) needs an approval."""
        return self.tools.get(name, UNLISTED_WRITE_POLICY)

    def missing_write_tools(self, write_tools: Iterable[str]) -> list[str]:
        return sorted(set(write_tools) - set(self.tools))


def load_policy(path: Path) -> PolicyFile:
    """Read and validate the policy file; errors name the file, the line and the field
    (`tool_policy.yaml:12: tools.refund.requires_approval.when.gte: ...`)."""
    if not path.is_file():
        raise ConfigError(
            f"tool policy file {path} does not exist",
            fix="create it or set LEDGERLOOP_POLICY_FILE to its path",
        )
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    lines = PolicyLines(text)
    try:
        policy = PolicyFile.model_validate(raw or {})
    except ValidationError as exc:
        where, message = describe_error(exc)
        line = lines.line(where)
        at = f"{path}:{line}: {where}" if line else f"{path}: {where}"
        raise ConfigError(f"{at}: {message}", fix="fix that field (see docs/policy.md)") from exc
    policy._lines = lines
    return policy


def describe_error(exc: ValidationError) -> tuple[str, str]:
    """The first problem's place (`tools.refund.requires_approval.when.all[0].gte`) and what
    is wrong there; a condition's or template's own place is appended to the model's."""
    first = exc.errors()[0]
    where = ""
    for part in first["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        else:
            where += f".{part}" if where else str(part)
    message = first["msg"]
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, ConditionError):
        message = inner.detail
        if inner.where:
            where = f"{where}.{inner.where}" if where else inner.where
    return where, message
