"""The policy's argument paths checked against the tools' argument models, at worker start.

A condition or summary template that names an argument the tool does not have would never
match (a rule that silently never asks for approval), so the worker refuses to start and names
the policy field and the tool's arguments. Paths are followed through nested pydantic models,
lists, tuples and dicts; past a field typed `Any` (or a plain dict) nothing more can be known,
so the rest of the path is accepted.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any, Union

from pydantic import BaseModel

from ledgerloop.tools.conditions import FieldPath
from ledgerloop.tools.policy import ApprovalRule, PolicyFile
from ledgerloop.tools.registry import Tool, ToolKind


def _options(annotation: Any) -> list[Any]:
    """The alternatives of a union (Optional included), else the annotation itself."""
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _options(typing.get_args(annotation)[0])
    return [annotation]


def _missing(annotation: Any, path: FieldPath) -> str | None:
    """The first segment of `path` that `annotation` cannot have, or None when it may."""
    if not path:
        return None
    head, rest = path[0], path[1:]
    verdicts: list[str | None] = []
    for option in _options(annotation):
        origin = typing.get_origin(option)
        if isinstance(option, type) and issubclass(option, BaseModel):
            field = option.model_fields.get(head)
            if field is None:
                verdicts.append(head)
                continue
            verdicts.append(_missing(field.annotation, rest))
        elif origin in (list, tuple) or option in (list, tuple):
            args = [a for a in typing.get_args(option) if a is not Ellipsis]
            if not head.isdigit():
                verdicts.append(head)
                continue
            verdicts.append(_missing(args[0], rest) if args else None)
        elif origin is dict:
            kv = typing.get_args(option)
            verdicts.append(_missing(kv[1], rest) if len(kv) == 2 else None)
        elif option is Any or option is dict or option is object:
            verdicts.append(None)
        else:
            verdicts.append(head)  # a plain value (int, str...) has no inner fields
    if any(v is None for v in verdicts):
        return None
    return verdicts[0] if verdicts else head


def _names(model: type[BaseModel]) -> str:
    return ", ".join(model.model_fields) or "none"


def argument_problems(policy: PolicyFile, tools: Iterable[Tool], policy_file: object) -> list[str]:
    """One line per policy path that names an argument its write tool does not have, with
    the file's line. Once per problem: agents that share a tool share its policy entry, and
    a wrong path in it is one mistake to fix (two tools of one name whose models differ may
    each have their own)."""
    problems: dict[str, None] = {}
    seen: set[int] = set()
    for tool in tools:
        if tool.kind is not ToolKind.WRITE or tool.name not in policy.tools or id(tool) in seen:
            continue
        seen.add(id(tool))
        rules = policy.tools[tool.name]
        paths: list[tuple[str, FieldPath]] = []
        if isinstance(rules.requires_approval, ApprovalRule):
            paths += [
                (f"requires_approval.when.{where}", path)
                for where, path in rules.requires_approval.condition.fields()
            ]
        template = rules.summary_template
        if template is not None:
            paths += [("summary", path) for path in template.fields()]
        for where, path in paths:
            missing = _missing(tool.input_model, path)
            if missing is None:
                continue
            shown = ".".join(path)
            at = policy.at(policy_file, f"tools.{tool.name}.{where}")
            problem = (
                f"{at}: {shown!r} is not an argument of tool {tool.name} "
                f"({tool.input_model.__name__}: {_names(tool.input_model)}); no {missing!r} there"
            )
            problems[problem] = None
    return list(problems)
