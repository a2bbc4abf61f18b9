"""docs/policy.md is the policy file's reference: each model's table lists exactly its fields,
each with the model's default, and the condition language's table lists exactly its forms."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ledgerloop.tools import policy
from ledgerloop.tools.conditions import COMBINATORS, COMPARISONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"
MODELS: list[type[BaseModel]] = [
    policy.PolicyFile,
    policy.ToolPolicy,
    policy.ApprovalRule,
    policy.SandboxLimits,
    policy.Destination,
    policy.McpServer,
    policy.McpWriteTool,
]


def _table(marker: str) -> list[list[str]]:
    """The rows (cells, backticks kept) of the table right after `<!-- marker -->`."""
    text = DOC.read_text()
    start = text.find(f"<!-- {marker} -->\n")
    assert start >= 0, f"docs/policy.md has no table marked <!-- {marker} -->"
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]  # past the header and its rule


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def _shown(value: Any) -> str:
    """A default as the doc writes it (YAML-like)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, BaseModel):
        return "see below"
    return str(value)


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return _shown(field.default_factory())  # type: ignore[call-arg]
    return _shown(field.default)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_documented_with_its_default(model: type[BaseModel]) -> None:
    rows = _table(f"model: {model.__name__}")
    documented = [_unquote(row[0]) for row in rows]
    assert sorted(documented) == sorted(model.model_fields), (
        f"docs/policy.md's {model.__name__} table lists {documented}; "
        f"the model has {list(model.model_fields)}"
    )
    for row in rows:
        name = _unquote(row[0])
        assert len(row) == 4, f"{model.__name__}.{name}: give a type, a default and a meaning"
        assert row[3], f"{model.__name__}.{name}: say what it means"
        assert _unquote(row[2]) == _default(model, name), (
            f"docs/policy.md says {model.__name__}.{name} defaults to {row[2]}; "
            f"the model says {_default(model, name)}"
        )


def test_every_model_of_the_file_has_a_table() -> None:
    # Models reachable from PolicyFile through its fields: none may go undocumented.
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [policy.PolicyFile]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            names = re.findall(r"ledgerloop\.tools\.policy\.(\w+)", str(field.annotation))
            names += [getattr(field.annotation, "__name__", "")]
            for name in names:
                found = getattr(policy, name, None)
                if isinstance(found, type) and issubclass(found, BaseModel):
                    todo.append(found)
    assert seen == set(MODELS)


def test_the_condition_language_table_lists_every_form() -> None:
    forms = set()
    for row in _table("condition-language"):
        match = re.match(r"`\{(?:field: PATH, )?(\w+):", row[0])
        assert match, f"unreadable form {row[0]}"
        forms.add(match.group(1))
    assert forms == set(COMPARISONS) | set(COMBINATORS)
