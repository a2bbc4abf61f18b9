"""Small modules named for what they do: none of the package's modules reaches 600 lines."""

from __future__ import annotations

from pathlib import Path

LIMIT = 600
PACKAGE = Path(__file__).resolve().parents[2] / "app" / "ledgerloop"


def test_every_module_is_under_the_limit() -> None:
    too_long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) >= LIMIT
    }
    assert too_long == {}, f"split these modules (at most {LIMIT - 1} lines each): {too_long}"
