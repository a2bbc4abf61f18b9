"""The public API: what `ledgerloop` exports, and that importing it loads nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ledgerloop


def test_every_exported_name_resolves_and_the_list_is_the_table() -> None:
    names = [n for n in ledgerloop.__all__ if n != "__version__"]
    assert sorted(names) == sorted(ledgerloop._EXPORTS)
    for name in names:
        value = getattr(ledgerloop, name)
        assert value is not None, name
        assert ledgerloop._EXPORTS[name] == value.__module__ or callable(value), name


def test_import_ledgerloop_loads_no_part_until_a_name_is_used() -> None:
    script = (
        "import sys, ledgerloop\n"
        "print(sorted(m for m in sys.modules if m.startswith(('ledgerloop', 'dbos', 'fastapi'))))\n"
        "ledgerloop.Agent\n"
        "print('ledgerloop.examples' in sys.modules, 'ledgerloop.testing' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "['ledgerloop', 'ledgerloop.version']"
    assert out[1] == "False False"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        ledgerloop.no_such_thing  # noqa: B018
