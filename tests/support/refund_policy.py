"""The test policy plus the refund module's rules, written where a test's worker reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.refund_agents import REFUND_RULES

SUPPORT = Path(__file__).resolve().parent
#: The agent modules a refund test's worker loads.
REFUND_MODULES = ("tests.support.agents", "tests.support.refund_agents")


def write_refund_policy(
    directory: Path, *, payments: str | dict[str, Any] = "http://127.0.0.1:9", **rules: Any
) -> Path:
    """tests/support/policy.yaml with `refund` (REFUND_RULES, updated by `rules`), `pay` and
    the `payments` destination added."""
    policy = yaml.safe_load((SUPPORT / "policy.yaml").read_text())
    policy["tools"]["refund"] = {**REFUND_RULES, **rules}
    policy["tools"]["pay"] = {"timeout_ms": 1000, "max_retries": 2}
    policy["destinations"]["payments"] = payments
    path = directory / "tool_policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path
