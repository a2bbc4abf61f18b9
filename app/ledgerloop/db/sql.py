"""Named SQL blocks: each part keeps its runtime queries in one .sql file you can read whole.

A file holds blocks that start with a line `-- name: noun_verb`; the block runs to the next
such line. Parameters use psycopg's `%(name)s` style.
"""

from __future__ import annotations

from importlib.resources import files
from typing import LiteralString


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, LiteralString]:
    text = files(package).joinpath(filename).read_text()
    # The text comes from files shipped with the package, never from input, so it is as
    # trusted as a literal in the source.
    queries: dict[str, LiteralString] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name:
                queries[name] = "\n".join(lines).strip()
            name, lines = line.removeprefix("-- name:").strip(), []
        elif name is not None:
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip()
    return queries
