"""Canonical JSON and the request hash that binds idempotency keys and approvals to one action.

The hash covers the tool, its arguments, its target and the policy version: change any of them
and it is a different action, which needs its own approval and may not reuse a key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values always give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_hash(tool: str, arguments: dict[str, Any], target: str, policy_version: str) -> str:
    """sha256 hex of the canonical JSON of the action."""
    document = {
        "tool": tool,
        "arguments": arguments,
        "target": target,
        "policy_version": policy_version,
    }
    return hashlib.sha256(canonical_json(document).encode()).hexdigest()


def idempotency_key(run_id: str, tool_call_id: str, *, compensation: bool = False) -> str:
    key = f"{run_id}:{tool_call_id}"
    return f"{key}:compensate" if compensation else key
