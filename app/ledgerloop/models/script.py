"""The YAML script that drives the scripted Messages API server.

The format is documented in the header of ``scripts/ops_demo.yaml``. A reply is picked by
(conversation, turn): the conversation by a substring of the first user message, the turn by the
number of assistant messages in the request. Both come from the request alone, so concurrent runs
and replayed requests get the same answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ledgerloop.errors import LedgerloopError

OPS_DEMO_SCRIPT = Path(__file__).parent / "scripts" / "ops_demo.yaml"

#: Output tokens billed for an ``empty: true`` reply: the provider failure we mimic burns tokens.
EMPTY_OUTPUT_TOKENS = 20_000

ErrorStatus = Literal[429, 500, 503, 529]


class ScriptError(LedgerloopError, ValueError):
    """The model script is invalid."""

    def __init__(self, path: str, field: str | None, problem: str) -> None:
        self.path = path
        self.field = field
        where = f"{path}: {field}" if field else path
        super().__init__(
            f"{where}: {problem}",
            fix="see the header of ledgerloop/models/scripts/ops_demo.yaml for the script format",
        )


class _Strict(BaseModel):
    # Unknown keys are typos in a hand-written file: refuse them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolUse(_Strict):
    """One tool call the model makes."""

    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class Reply(_Strict):
    """One answer: content (text and/or tool calls), an empty turn, or an HTTP error."""

    text: str | None = None
    tool_use: list[ToolUse] = Field(default_factory=list)
    empty: bool = False
    status: ErrorStatus | None = None
    times: int | None = Field(default=None, ge=1)
    then: Reply | None = None
    message: str | None = None
    output_tokens: int | None = Field(default=None, ge=0)
    delay_ms: int = Field(default=0, ge=0)
    #: A streamed answer's pause before each text delta after the first (a slow writer).
    delta_delay_ms: int = Field(default=0, ge=0)
    retry_after_s: int | None = Field(default=None, ge=0, le=3600)

    @field_validator("tool_use", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        # `tool_use: {name, input}` is shorthand for a list of one.
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        _check_reply(self)
        return self

    @property
    def is_error(self) -> bool:
        return self.status is not None


def _check_reply(reply: Reply) -> None:
    has_content = reply.text is not None or bool(reply.tool_use)
    if reply.status is not None:
        if has_content or reply.empty:
            raise ValueError("an error reply (`status`) puts its eventual answer under `then`")
        if (reply.times is None) != (reply.then is None):
            raise ValueError("`times` and `then` go together (omit both to fail every attempt)")
        if reply.then is not None and reply.then.is_error:
            raise ValueError("`then` must be an answer, not another error")
        return
    if (
        reply.times is not None
        or reply.then is not None
        or reply.message is not None
        or reply.retry_after_s is not None
    ):
        raise ValueError("`times`, `then`, `message` and `retry_after_s` need `status`")
    if reply.empty and has_content:
        raise ValueError("`empty: true` cannot have `text` or `tool_use`")
    if not reply.empty and not has_content:
        raise ValueError("a reply needs `text`, `tool_use`, `empty: true` or `status`")


class Turn(Reply):
    """A reply, or ``by_model``: one reply per model name, ``"*"`` for any other model."""

    by_model: dict[str, Reply] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if self.by_model is None:
            _check_reply(self)
        elif self.model_fields_set - {"by_model"}:
            raise ValueError("`by_model` cannot be mixed with other keys; put them in each reply")
        elif not self.by_model:
            raise ValueError("`by_model` needs at least one model")
        return self

    def for_model(self, model: str) -> Reply | None:
        """The reply for ``model``, or None when ``by_model`` has neither it nor ``"*"``."""
        if self.by_model is None:
            return self
        return self.by_model.get(model, self.by_model.get("*"))


class Conversation(_Strict):
    turns: list[Turn] = Field(default_factory=list)


class MatchedConversation(Conversation):
    """A conversation used when ``match`` occurs in the first user message."""

    match: str = Field(min_length=1)
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.match


class Script(_Strict):
    default: Conversation = Field(default_factory=Conversation)
    conversations: list[MatchedConversation] = Field(default_factory=list)

    def conversation_for(self, first_user_text: str) -> tuple[str, Conversation]:
        """The (label, conversation) for a request whose first user message is given."""
        for conversation in self.conversations:
            if conversation.match in first_user_text:
                return conversation.label, conversation
        return "default", self.default


def parse_script(text: str, source: str = "<string>") -> Script:
    """Parse YAML text; ``source`` names it in errors."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScriptError(source, None, f"not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScriptError(source, None, "the top level must be a mapping")
    try:
        return Script.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
        problem = first["msg"].removeprefix("Value error, ") + more
        raise ScriptError(source, _dotted(first["loc"]), problem) from exc


def load_script(path: str | Path) -> Script:
    """Read and validate a script file, raising ScriptError naming the file and the bad field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(str(path), None, f"cannot read: {exc.strerror or exc}") from exc
    return parse_script(text, source=str(path))


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``('conversations', 0, 'match')`` -> ``conversations[0].match``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<top level>"
