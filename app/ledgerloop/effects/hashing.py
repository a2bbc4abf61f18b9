"""Canonical JSON and the request hash that binds idempotency keys and approvals to one action.

The hash covers the tool, its arguments, its target and the policy version: change any of them
and it is a different action, which needs its own approval and may not reuse a key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from contextvars import ContextVar
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


#: In a forked run's workflow: (the fork's run id, {tool call id: the run whose model asked
#: for it}) for the calls its journal inherited from its parent (control/fork.py). Their
#: effects keep the parent's keys, so a step the fork runs again finds them recorded and
#: delivered instead of sending them anew; calls the fork's own model makes get its own id.
inherited_calls: ContextVar[tuple[str, Mapping[str, str]] | None] = ContextVar(
    "ledgerloop_inherited_calls", default=None
)


def idempotency_key(run_id: str, tool_call_id: str, *, compensation: bool = False) -> str:
    inherited = inherited_calls.get()
    if inherited is not None and inherited[0] == run_id:
        run_id = inherited[1].get(tool_call_id, run_id)
    key = f"{run_id}:{tool_call_id}"
    return f"{key}:compensate" if compensation else key
