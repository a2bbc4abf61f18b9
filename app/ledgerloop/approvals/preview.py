"""What an approver reads before deciding: the tool, one summary line, and the arguments.

The preview is stored with the approval, so it must never hold a secret: arguments whose names
look like credentials are left out (at any depth) and the preview says which ones. Long values
are cut, so a 1 MB document argument cannot drown the page. The hash the approver approves
still covers every argument, hidden or not.
"""

from __future__ import annotations

import itertools
import json
import re
import string
from collections.abc import Mapping
from typing import Any

MAX_VALUE_CHARS = 200
MAX_SUMMARY_CHARS = 160
MAX_LINES = 50
HIDDEN = "[hidden]"

# A key is secret-looking when one of its words is one of these, or two neighbouring words
# form one of the pairs. Whole words, so `max_tokens` and `author` stay visible while
# `access_token`, `X-Api-Key` and `clientSecret` do not.
_SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "cookie",
        "credential",
        "credentials",
        "passphrase",
        "passwd",
        "password",
        "privatekey",
        "pwd",
        "secret",
        "token",
    }
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
_WORD_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def looks_secret(key: str) -> bool:
    words = [w.lower() for w in _WORD_RE.findall(key)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def truncate(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _redact(value: Any, path: str, hidden: list[str]) -> Any:
    """`value` with secret-looking keys removed at every depth; their paths go to `hidden`."""
    if isinstance(value, Mapping):
        kept: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            where = f"{path}.{name}" if path else name
            if looks_secret(name):
                hidden.append(where)
            else:
                kept[name] = _redact(item, where, hidden)
        return kept
    if isinstance(value, list | tuple):
        return [_redact(item, f"{path}[{i}]", hidden) for i, item in enumerate(value)]
    return value


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


class _Fields(dict[str, Any]):
    """Template fields: hidden arguments read as [hidden], unknown ones as {name}."""

    def __missing__(self, key: str) -> str:
        return HIDDEN if looks_secret(key) else "{" + key + "}"


def _summary(tool: str, visible: dict[str, Any], policy: Mapping[str, Any]) -> str:
    template = policy.get("summary")
    if isinstance(template, str) and template:
        fields = _Fields({k: truncate(_render(v), 60) for k, v in visible.items()})
        try:
            return truncate(string.Formatter().vformat(template, (), fields), MAX_SUMMARY_CHARS)
        except (ValueError, IndexError, AttributeError, KeyError):
            pass  # a broken template must not block the approval: fall back to the default
    shown = ", ".join(f"{k}={truncate(_render(v), 40)}" for k, v in list(visible.items())[:3])
    more = ", …" if len(visible) > 3 else ""
    return truncate(f"{tool}({shown}{more})", MAX_SUMMARY_CHARS)


def render_preview(
    tool: str, arguments: Mapping[str, Any], policy: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON-ready preview: tool, summary, `key: value` lines, hidden argument names, note.

    `policy` may give `summary` (a str.format template over the arguments, e.g.
    "Refund {amount} to {customer}") and `version` (shown as policy_version).
    """
    policy = policy or {}
    hidden: list[str] = []
    visible = _redact(dict(arguments), "", hidden)
    lines = [f"{truncate(k, 64)}: {truncate(_render(v))}" for k, v in visible.items()]
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"… {len(lines) - MAX_LINES} more arguments"]
    preview: dict[str, Any] = {
        "tool": tool,
        "summary": _summary(tool, visible, policy),
        "lines": lines,
        "hidden": hidden,
    }
    if hidden:
        what = (
            "1 argument that looks like a secret is"
            if len(hidden) == 1
            else f"{len(hidden)} arguments that look like secrets are"
        )
        preview["note"] = (
            f"{what} not shown: {', '.join(hidden)}. The approval still covers their exact values."
        )
    if policy.get("version") is not None:
        preview["policy_version"] = str(policy["version"])
    return preview
