"""The policy's `summary` template: one line for the approver, from the tool's arguments.

`"Refund {amount_cents} cents to {customer.name}"`: literal text with `{PATH}` fields, PATH as
in conditions (names joined by dots, numbers for list positions), `{{` and `}}` for braces.
Fields are looked up in plain data by our own resolver: no attribute access, no indexing
syntax, no conversions (`!r`) and no format specs, so a template can read arguments and nothing
else. A template is checked when the policy loads; rendering never fails.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ledgerloop.tools.conditions import ConditionError, FieldPath, parse_path


@dataclass(frozen=True)
class Template:
    source: str
    #: Literal text and field paths, in order.
    parts: tuple[str | FieldPath, ...]

    def render(self, value_of: Callable[[FieldPath], str]) -> str:
        return "".join(part if isinstance(part, str) else value_of(part) for part in self.parts)

    def fields(self) -> Iterator[FieldPath]:
        for part in self.parts:
            if not isinstance(part, str):
                yield part


def parse_template(text: str, where: str = "") -> Template:
    """A template from its text; ConditionError (with `where`) says what is wrong and how to
    write it instead."""
    parts: list[str | FieldPath] = []
    try:
        pieces = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConditionError(
            where, f"{text!r} is not a template ({exc}); write {{{{ and }}}} for literal braces"
        ) from exc
    for literal, field, spec, conversion in pieces:
        if literal:
            parts.append(literal)
        if field is None:
            continue
        if conversion or spec:
            raise ConditionError(
                where,
                f"{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
                ": a field is only {name} or {name.inner}, without ! or :",
            )
        if not field:
            raise ConditionError(where, "{} needs an argument name, e.g. {amount_cents}")
        parts.append(parse_path(field, where))
    return Template(text, tuple(parts))
