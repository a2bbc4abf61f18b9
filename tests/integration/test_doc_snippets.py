"""Every code block in the docs and the README is checked, so the docs cannot drift from the code.

How a block is checked follows from its language, unless the line before it says otherwise
(`<!-- snippet: fragment -->` for an excerpt that cannot stand alone):

- `python`: run, in a fresh namespace holding `conn` (a connection to a freshly migrated
  database). A fragment is parsed, and every name it imports from `ledgerloop` must exist.
- `yaml`: a tool policy file, validated by the worker's own loader. A fragment is parsed.
- `sql`: run against a freshly migrated database, each file's blocks in order, after the
  file's setup below (rolled back). A fragment (a signature) is not run.
- `ini`: parsed.
Other languages (bash, json, mermaid, text) are prose for people and are not checked here.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml

from ledgerloop.db.connect import Conn
from ledgerloop.tools.policy import load_policy
from tests.conftest import REPO

DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
CHECKED = {"python", "yaml", "sql", "ini"}
FENCE = re.compile(
    r"(?P<marker><!-- snippet: (?P<kind>[a-z]+) -->\n)?"
    r"^```(?P<lang>[a-z]+)[^\n]*\n(?P<body>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
#: What a file's SQL blocks assume exists: the tables its examples write to.
SQL_SETUP = {
    "sql_start_run.md": "CREATE TABLE public.tickets (id bigint PRIMARY KEY, subject text)",
    "README.md": (
        "CREATE TABLE public.orders (id bigint GENERATED ALWAYS AS IDENTITY, customer text)"
    ),
}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    fragment: bool
    body: str

    def __str__(self) -> str:
        return f"{self.path.name}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match["lang"] not in CHECKED:
                continue
            kind = match["kind"]
            assert kind in (None, "fragment"), f"{path.name}: unknown snippet marker {kind!r}"
            line = text.count("\n", 0, match.start("body"))
            found.append(Snippet(path, line, match["lang"], kind == "fragment", match["body"]))
    return found


SNIPPETS = snippets()


def _by(lang: str) -> list[Snippet]:
    return [s for s in SNIPPETS if s.lang == lang]


def _check_ledgerloop_imports(snippet: Snippet, tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ledgerloop"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), (
                    f"{snippet}: {node.module} has no {alias.name} (the docs drifted)"
                )


@pytest.mark.parametrize("snippet", _by("python"), ids=str)
def test_python_snippet(snippet: Snippet, conn: Conn) -> None:
    tree = ast.parse(snippet.body, str(snippet))
    _check_ledgerloop_imports(snippet, tree)
    if snippet.fragment:
        return
    with conn.transaction(force_rollback=True):
        if snippet.path.name in SQL_SETUP:
            conn.execute(SQL_SETUP[snippet.path.name])  # type: ignore[arg-type]
        # The docs' own code, run as a reader would run it.
        exec(compile(tree, str(snippet), "exec"), {"conn": conn, "__name__": "snippet"})  # noqa: S102


@pytest.mark.parametrize("snippet", _by("yaml"), ids=str)
def test_yaml_snippet(snippet: Snippet, tmp_path: Path) -> None:
    parsed = yaml.safe_load(snippet.body)
    if snippet.fragment:
        return
    assert isinstance(parsed, dict), f"{snippet}: not a policy file"
    policy = tmp_path / "tool_policy.yaml"
    policy.write_text(snippet.body)
    load_policy(policy)


def test_sql_snippets(conn: Conn) -> None:
    blocks = _by("sql")
    assert blocks
    for path in sorted({s.path for s in blocks}):
        with conn.transaction(force_rollback=True):
            if path.name in SQL_SETUP:
                conn.execute(SQL_SETUP[path.name])  # type: ignore[arg-type]
            for snippet in (s for s in blocks if s.path == path):
                if snippet.fragment:
                    continue
                # A block may hold its own BEGIN/COMMIT: inside this transaction they are
                # savepoint-free no-ops Postgres only warns about.
                body = re.sub(r"^(BEGIN|COMMIT);.*$", "", snippet.body, flags=re.MULTILINE)
                # The examples' database is `app`; this one has its own name.
                body = body.replace("ALTER DATABASE app ", f'ALTER DATABASE "{conn.info.dbname}" ')
                try:
                    conn.execute(body)  # type: ignore[arg-type]
                except psycopg.Error as exc:
                    pytest.fail(f"{snippet}: {exc}")


@pytest.mark.parametrize("snippet", _by("ini"), ids=str)
def test_ini_snippet(snippet: Snippet) -> None:
    parser = configparser.ConfigParser(inline_comment_prefixes=("#",))
    parser.read_string(snippet.body)
    assert parser.sections(), f"{snippet}: no section"


def test_every_doc_has_been_looked_at() -> None:
    # The fence pattern finds blocks in every page that has them (a broken pattern finds none).
    assert {s.path.name for s in SNIPPETS} >= {"sql_start_run.md", "testing.md", "sandbox.md"}
