"""The project's SQL as loaded from its .sql files (db.sql.load_queries): each query keeps
its code and a one-line label, and fits the text psycopg parses once and caches."""

from __future__ import annotations

from pathlib import Path

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from ledgerloop.agent.effect_record import RECORD_CLAIMED
from ledgerloop.db import dbos_checkpoint
from ledgerloop.db.sql import load_queries

APP = Path(__file__).resolve().parents[2] / "app"


def _all_files() -> list[tuple[str, str]]:
    found = [
        (".".join(path.parent.relative_to(APP).parts), path.name)
        for path in sorted((APP / "ledgerloop").rglob("*.sql"))
    ]
    assert len(found) >= 10, found  # the walk found the package's files
    return found


def _blocks(package: str, filename: str) -> dict[str, list[str]]:
    """Each block's lines as written in the file, trailing blank lines left out."""
    text = (APP.joinpath(*package.split(".")) / filename).read_text()
    blocks: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("-- name:"):
            name = line.removeprefix("-- name:").strip()
            blocks[name] = []
        elif name is not None:
            blocks[name].append(line)
    return blocks


def test_a_query_keeps_its_code_and_first_line_and_drops_comment_lines() -> None:
    checked = 0
    for package, filename in _all_files():
        written = _blocks(package, filename)
        loaded = load_queries(package, filename)
        assert set(loaded) == set(written), (package, filename)
        for name, lines in written.items():
            text = "\n".join(lines).strip().split("\n")
            code = [line.strip() for line in text[1:] if not line.lstrip().startswith("--")]
            assert loaded[name].split("\n") == [text[0], *code], (filename, name)
            checked += 1
    assert checked >= 50, checked


def test_every_query_and_the_checkpoint_with_its_rider_fit_psycopgs_cache() -> None:
    """psycopg parses a query's text (its `%(name)s` placeholders) once and caches it only up
    to MAX_CACHED_STATEMENT_LENGTH characters; a longer one is parsed at every execution. The
    step checkpoint with the write's record riding it (every write turn) measured 4,246
    characters with its comments, and each parse took about 65 us on the step's thread."""
    for package, filename in _all_files():
        for name, query in load_queries(package, filename).items():
            assert len(query) <= MAX_CACHED_STATEMENT_LENGTH, (filename, name, len(query))
    with_rider = dbos_checkpoint._with(RECORD_CLAIMED)
    assert len(with_rider) <= MAX_CACHED_STATEMENT_LENGTH, len(with_rider)
