"""The policy's condition language: when a write tool's call needs a person's approval.

A condition is data, never code. It is one mapping of exactly one of:

    {field: PATH, OP: VALUE}      OP: eq ne lt lte gt gte in not_in exists
    {all: [CONDITION, ...]}       every one holds (an empty list holds)
    {any: [CONDITION, ...]}       at least one holds (an empty list does not)
    {not: CONDITION}

PATH names a value in the tool's validated arguments: names joined by dots, with a number for
a position in a list (`customer.country`, `lines.0.amount_cents`). A field that is absent (or
null) makes every comparison false except `exists: false` and `ne`. An ordering comparison
(lt lte gt gte) between a value and a bound of another kind (text against a number, say)
cannot be decided; it makes the whole rule ask for an approval (fail closed).

Parsing errors carry the path inside the condition (`all[0].gte`), so a policy load error
names the file and the exact field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPARISONS = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "not_in", "exists")
ORDERINGS = frozenset({"lt", "lte", "gt", "gte"})
COMBINATORS = ("all", "any", "not")
_SEGMENT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*|\d+")
ABSENT = object()


class ConditionError(ValueError):
    """A condition that cannot be parsed; `where` is its place inside the condition."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.detail = message


class Undecidable(Exception):
    """A comparison whose operands are of kinds that cannot be ordered."""


FieldPath = tuple[str, ...]


def parse_path(text: object, where: str) -> FieldPath:
    """`a.b.0` -> ("a", "b", "0"); each segment a name or a list position."""
    if not isinstance(text, str) or not text:
        raise ConditionError(where, "a field path is a non-empty string such as amount_cents")
    segments = tuple(text.split("."))
    for segment in segments:
        if not _SEGMENT_RE.fullmatch(segment):
            raise ConditionError(
                where,
                f"{text!r} is not a field path: use argument names joined by dots, "
                "and numbers for list positions (customer.country, lines.0.amount_cents); "
                "a name starts with a letter",
            )
    return segments


def resolve(arguments: Any, path: FieldPath) -> Any:
    """The value at `path` in plain data (mappings and lists), or ABSENT. Never getattr."""
    value = arguments
    for segment in path:
        if isinstance(value, Mapping):
            value = value.get(segment, ABSENT)
        elif isinstance(value, list | tuple) and segment.isdigit():
            index = int(segment)
            value = value[index] if index < len(value) else ABSENT
        else:
            return ABSENT
        if value is ABSENT:
            return ABSENT
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _orderable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def _equal(a: Any, b: Any) -> bool:
    # true == 1 in Python; not here: a flag is not an amount.
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


@dataclass(frozen=True)
class Compare:
    path: FieldPath
    op: str
    value: Any
    where: str

    def holds(self, arguments: Any) -> bool:
        found = resolve(arguments, self.path)
        present = found is not ABSENT and found is not None
        if self.op == "exists":
            return present is bool(self.value)
        if self.op == "ne":
            return not present or not _equal(found, self.value)
        if not present:
            return False
        if self.op == "eq":
            return _equal(found, self.value)
        if self.op == "in":
            return any(_equal(found, item) for item in self.value)
        if self.op == "not_in":
            return not any(_equal(found, item) for item in self.value)
        if not _orderable(found, self.value):
            raise Undecidable(
                f"{self.where}: {'.'.join(self.path)} is {found!r}, "
                f"which cannot be compared with {self.value!r}"
            )
        if self.op == "lt":
            return bool(found < self.value)
        if self.op == "lte":
            return bool(found <= self.value)
        if self.op == "gt":
            return bool(found > self.value)
        return bool(found >= self.value)

    def fields(self) -> Iterator[tuple[str, FieldPath]]:
        yield f"{self.where}.field" if self.where else "field", self.path


@dataclass(frozen=True)
class Combine:
    kind: str  # all / any
    parts: tuple[Condition, ...]

    def holds(self, arguments: Any) -> bool:
        if self.kind == "all":
            return all(part.holds(arguments) for part in self.parts)
        return any(part.holds(arguments) for part in self.parts)

    def fields(self) -> Iterator[tuple[str, FieldPath]]:
        for part in self.parts:
            yield from part.fields()


@dataclass(frozen=True)
class Negate:
    part: Condition

    def holds(self, arguments: Any) -> bool:
        return not self.part.holds(arguments)

    def fields(self) -> Iterator[tuple[str, FieldPath]]:
        yield from self.part.fields()


Condition = Compare | Combine | Negate


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def parse_condition(raw: object, where: str = "") -> Condition:
    """A condition from its YAML form; ConditionError names the place of the first problem."""
    if not isinstance(raw, Mapping):
        raise ConditionError(
            where,
            "a condition is a mapping: {field: NAME, gte: 5000}, {all: [...]}, {any: [...]} "
            "or {not: ...}",
        )
    keys = [str(k) for k in raw]
    combinators = [k for k in keys if k in COMBINATORS]
    if combinators:
        if len(keys) != 1:
            raise ConditionError(
                where,
                f"{combinators[0]} stands alone in its mapping; found also "
                f"{', '.join(k for k in keys if k != combinators[0])}",
            )
        kind = combinators[0]
        inner = _join(where, kind)
        if kind == "not":
            return Negate(parse_condition(raw[kind], inner))
        items = raw[kind]
        if not isinstance(items, Sequence) or isinstance(items, str | bytes):
            raise ConditionError(inner, f"{kind} takes a list of conditions")
        parts = tuple(parse_condition(c, f"{inner}[{i}]") for i, c in enumerate(items))
        return Combine(kind, parts)
    return _parse_comparison(raw, keys, where)


def _parse_comparison(raw: Mapping[Any, Any], keys: list[str], where: str) -> Compare:
    unknown = [k for k in keys if k != "field" and k not in COMPARISONS]
    if unknown:
        raise ConditionError(
            _join(where, unknown[0]),
            f"unknown key; a condition has field plus one of {', '.join(COMPARISONS)}, "
            f"or is all/any/not",
        )
    if "field" not in raw:
        raise ConditionError(where, "a comparison needs `field:` (the argument it looks at)")
    path = parse_path(raw["field"], _join(where, "field"))
    ops = [k for k in keys if k in COMPARISONS]
    if len(ops) != 1:
        raise ConditionError(
            where,
            f"a comparison has exactly one of {', '.join(COMPARISONS)}; found "
            f"{', '.join(ops) or 'none'} (combine several with all:)",
        )
    op = ops[0]
    value = raw[op]
    at = _join(where, op)
    if op == "exists":
        if not isinstance(value, bool):
            raise ConditionError(at, "exists takes true or false")
    elif op in ("in", "not_in"):
        if not isinstance(value, list) or not value:
            raise ConditionError(at, f"{op} takes a non-empty list of values")
        for i, item in enumerate(value):
            _check_scalar(item, f"{at}[{i}]")
    elif op in ORDERINGS:
        if not (_is_number(value) or isinstance(value, str)):
            raise ConditionError(at, f"{op} takes a number or a string, got {value!r}")
    else:
        _check_scalar(value, at)
    return Compare(path, op, value, where)


def _check_scalar(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str | int | float | bool):
        raise ConditionError(
            where, f"compare with a number, string, true/false or null, not {value!r}"
        )
