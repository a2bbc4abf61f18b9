"""tool_policy.yaml: per-tool rules, validated once at start-up.

A bad file fails with its path and the offending field; nothing about a tool's safety is
decided by a prompt.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledgerloop.errors import ConfigError


class OnReject(StrEnum):
    CONTINUE = "continue"  # tell the model "rejected" as an error tool result and go on
    CANCEL = "cancel"  # cancel the run


class OnTimeout(StrEnum):
    CANCEL = "cancel"
    KEEP_WAITING = "keep_waiting"


class ToolPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    requires_approval: bool = False
    approver_roles: tuple[str, ...] = ("approver",)
    approval_ttl_s: float = Field(default=8 * 3600, gt=0)
    on_reject: OnReject = OnReject.CONTINUE
    on_timeout: OnTimeout = OnTimeout.CANCEL
    idempotency_header: str = "Idempotency-Key"
    timeout_ms: int = Field(default=10_000, gt=0, le=600_000)
    max_retries: int = Field(default=2, ge=0, le=10)
    deadline_s: float = Field(default=300, gt=0)
    cache_ttl_s: float = Field(default=0, ge=0)
    sandbox: Literal["none", "microvm", "gvisor"] = "none"
    network: Literal["default-deny", "allow"] = "default-deny"


DEFAULT_POLICY = ToolPolicy()


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1)
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    destinations: dict[str, str] = Field(default_factory=dict)

    def for_tool(self, name: str) -> ToolPolicy:
        return self.tools.get(name, DEFAULT_POLICY)


def load_policy(path: Path) -> PolicyFile:
    """Read and validate the policy file; errors name the file and the field."""
    if not path.is_file():
        raise ConfigError(
            f"tool policy file {path} does not exist",
            fix="create it or set LEDGERLOOP_POLICY_FILE to its path",
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return PolicyFile.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ConfigError(
            f"{path}: {field}: {first['msg']}", fix="fix that field (see docs/operations.md)"
        ) from exc
