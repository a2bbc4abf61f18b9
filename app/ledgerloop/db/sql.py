"""Named SQL blocks: each part keeps its runtime queries in one .sql file you can read whole.

A file holds blocks that start with a line `-- name: noun_verb`; the block runs to the next
such line. Parameters use psycopg's `%(name)s` style.

The comments that explain a block stay in the file: a loaded query keeps only its first
line when that is a comment (its label in pg_stat_statements and pg_stat_activity) and drops
every other line that is only a comment. The text goes to the server on every execution
that is not yet prepared, and psycopg caches its parsing of a query only up to 4,096
characters: the step checkpoint with the write's record riding it came to 4,246 with its
comments, so every write parsed it anew.
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
    return {name: _without_comment_lines(query) for name, query in queries.items()}


def _without_comment_lines(query: LiteralString) -> LiteralString:
    first, _, rest = query.partition("\n")
    # Indentation is for the reader of the .sql file; dropping it keeps long statements (the
    # heartbeat's) within psycopg's parse cache (tests/unit/test_sql_queries.py).
    kept = [line.strip() for line in rest.split("\n") if not line.lstrip().startswith("--")]
    return "\n".join([first, *kept]) if rest else first
