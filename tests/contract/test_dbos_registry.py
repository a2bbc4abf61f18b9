"""ledgerloop.dbos_internals lists every DBOS internal the code uses, each with its contract test.

A module that starts using a DBOS private name or writes SQL on a DBOS table fails here until
the use is listed (with the reason it stays) and has a contract test.
"""

from __future__ import annotations

import re
from pathlib import Path

from ledgerloop.db.connect import Conn
from ledgerloop.dbos_internals import INTERNALS, PUBLIC_SQL_FUNCTIONS
from tests.conftest import REPO

_SOURCES = [
    *sorted((REPO / "app" / "ledgerloop").rglob("*.py")),
    *sorted((REPO / "app" / "ledgerloop").rglob("*.sql")),
    *sorted((REPO / "migrations" / "versions").glob("*.py")),
]
_PRIVATE_IMPORT = re.compile(r"from (dbos\._\w+) import ([\w, ]+)")
_PRIVATE_ATTRIBUTE = re.compile(r"\bDBOS\._\w+")
_SQL_NAME = re.compile(r"\bdbos\.([a-z][a-z_]*)\b")


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _private_names(text: str) -> set[str]:
    names = set(_PRIVATE_ATTRIBUTE.findall(text))
    for module, imported in _PRIVATE_IMPORT.findall(text):
        names.update(f"{module}.{name.strip()}" for name in imported.split(","))
    return names


def test_every_entry_has_its_contract_test_and_its_files() -> None:
    names = [entry.name for entry in INTERNALS]
    assert len(names) == len(set(names))
    contracts = (Path(__file__).parent / "test_dbos_contracts.py").read_text()
    for entry in INTERNALS:
        assert f"def {entry.contract_test}(" in contracts, (
            f"{entry.name} has no contract test {entry.contract_test}"
        )
        for path in entry.used_in:
            assert (REPO / path).is_file(), f"{entry.name}: {path} does not exist"


def test_every_private_dbos_name_in_use_is_listed() -> None:
    listed = {(path, name) for e in INTERNALS for path in e.used_in for name in e.private_names}
    for path in _SOURCES:
        rel = _relative(path)
        if rel == "app/ledgerloop/dbos_internals.py":
            continue
        for name in _private_names(path.read_text()):
            assert (rel, name) in listed, (
                f"{rel} uses DBOS's private {name}: use a public DBOS API, or list it in "
                "ledgerloop/dbos_internals.py with why it stays and add its contract test"
            )


def test_every_dbos_table_named_in_sql_is_listed(cconn: Conn) -> None:
    tables = {
        r["table_name"]
        for r in cconn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'dbos'"
        ).fetchall()
    }
    assert {"workflow_status", "notifications"} <= tables
    listed = {(path, table) for e in INTERNALS for path in e.used_in for table in e.tables}
    for path in _SOURCES:
        rel = _relative(path)
        if rel == "app/ledgerloop/dbos_internals.py":
            continue
        for name in set(_SQL_NAME.findall(path.read_text())):
            if name in PUBLIC_SQL_FUNCTIONS or name not in tables:
                continue
            assert (rel, name) in listed, (
                f"{rel} names DBOS's table dbos.{name}: read it through DBOS's API, or list "
                "the use in ledgerloop/dbos_internals.py with why it stays and its contract test"
            )


def test_the_upgrade_guide_lists_every_internal_and_no_other() -> None:
    guide = (REPO / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", guide, re.MULTILINE))
    assert documented == {entry.name for entry in INTERNALS}, (
        "docs/operations.md (Upgrading DBOS) and ledgerloop/dbos_internals.py disagree: "
        f"only in the docs {sorted(documented - {e.name for e in INTERNALS})}, "
        f"only in the registry {sorted({e.name for e in INTERNALS} - documented)}"
    )
