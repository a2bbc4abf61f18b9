"""What an approver reads before deciding: the tool, one summary line, and the arguments.

What the approver reads must be what runs. Text that renders as something else is shown
escaped: bidirectional controls (a right-to-left override turns `exe.txt` into `txt.exe`),
line breaks and other control or invisible format characters appear as `\u202e`, `\n`, ...
Each argument is also given on its own (`arguments`: name, and the value as JSON), so where
one argument ends and the next begins never depends on the values' own text.

The preview is stored with the approval, so it must never hold a secret: arguments whose names
look like credentials are left out (at any depth) and the preview says which ones. Long values
are cut, so a 1 MB document argument cannot drown the page. The hash the approver approves
still covers every argument, hidden or not.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from ledgerloop.tools.conditions import ABSENT, ConditionError, FieldPath, resolve
from ledgerloop.tools.templates import parse_template

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


#: Credentials written inside text (an error that quotes a header, say).
_SECRET_TEXT_RE = re.compile(
    r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}|\bllt_[0-9a-f]{32}_[A-Za-z0-9_-]{43}\b"
)


def redact_secrets(value: Any) -> Any:
    """`value` with the values of secret-looking keys replaced by [hidden] at every depth, and
    bearer/basic credentials and Ledgerloop tokens inside text masked. For records kept for
    people to read (an effect's evidence holds whole delivery requests, headers included)."""
    if isinstance(value, Mapping):
        return {
            str(key): HIDDEN if looks_secret(str(key)) else redact_secrets(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_secrets(item) for item in value]
    if isinstance(value, str):
        return _SECRET_TEXT_RE.sub(
            lambda m: f"{m.group(1)} {HIDDEN}" if m.group(1) else HIDDEN, value
        )
    return value


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    # Cc: controls (line breaks included); Cf: invisible format characters, among them every
    # bidirectional control and the zero-width ones; Zl/Zp: line and paragraph separators.
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
        return _ESCAPES.get(char) or f"\\u{ord(char):04x}"
    return char


def neutralise(text: str) -> str:
    """`text` with every character that could make it read as something else made visible."""
    if text.isprintable():
        return text  # the common case: nothing to escape
    return "".join(_escape(char) for char in text)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return neutralise(value)
    return neutralise(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _json(value: Any) -> str:
    """The value exactly as JSON (strings quoted), neutralised: its bounds are its quotes."""
    return neutralise(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _template_summary(template: str, fields: Mapping[str, Any]) -> str | None:
    """The policy's template over the arguments, or None when it is not a valid template (a
    policy file's is checked at load; one handed in directly may not be). Secret-looking
    fields read as [hidden], unknown ones as {name}."""
    try:
        parsed = parse_template(neutralise(template))
    except ConditionError:
        return None

    def value_of(path: FieldPath) -> str:
        if any(looks_secret(segment) for segment in path):
            return HIDDEN
        found = resolve(fields, path)
        if found is ABSENT:
            return "{" + ".".join(path) + "}"
        return truncate(_render(found), 60)

    return parsed.render(value_of)


def _summary(
    tool: str,
    visible: dict[str, Any],
    policy: Mapping[str, Any],
    fields: Mapping[str, Any],
    tool_summary: str | None,
) -> str:
    template = policy.get("summary")
    if isinstance(template, str) and template:
        made = _template_summary(template, fields)
        if made is not None:
            return truncate(made, MAX_SUMMARY_CHARS)
        # a broken template must not block the approval: fall back
    if tool_summary:
        return truncate(neutralise(tool_summary), MAX_SUMMARY_CHARS)
    shown = ", ".join(
        f"{neutralise(k)}={truncate(_render(v), 40)}" for k, v in list(visible.items())[:3]
    )
    more = ", …" if len(visible) > 3 else ""
    return truncate(f"{neutralise(tool)}({shown}{more})", MAX_SUMMARY_CHARS)


def render_preview(
    tool: str,
    arguments: Mapping[str, Any],
    policy: Mapping[str, Any] | None = None,
    *,
    fields: Mapping[str, Any] | None = None,
    tool_summary: str | None = None,
) -> dict[str, Any]:
    """A JSON-ready preview: tool, summary, `key: value` lines, hidden argument names, note.

    `arguments` are what will be sent (the effect's body). `policy` may give `summary` (a
    template over `fields`, the tool's validated arguments, e.g. "Refund {amount} to
    {customer.name}"; default: `arguments`) and `version` (shown as policy_version).
    The summary is the policy's template, else `tool_summary` (the tool's own `preview`),
    else `tool(k=v, ...)`.
    """
    policy = policy or {}
    hidden: list[str] = []
    visible = _redact(dict(arguments), "", hidden)
    template_fields = visible if fields is None else _redact(dict(fields), "", [])
    lines = [f"{truncate(neutralise(k), 64)}: {truncate(_render(v))}" for k, v in visible.items()]
    shown_arguments = [
        {"name": truncate(neutralise(k), 64), "value": truncate(_json(v))}
        for k, v in list(visible.items())[:MAX_LINES]
    ]
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"… {len(lines) - MAX_LINES} more arguments"]
    preview: dict[str, Any] = {
        "tool": neutralise(tool),
        "summary": _summary(tool, visible, policy, template_fields, tool_summary),
        "lines": lines,
        "arguments": shown_arguments,
        "hidden": [neutralise(path) for path in hidden],
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
