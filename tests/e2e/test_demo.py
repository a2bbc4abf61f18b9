"""The README's first command: `ledgerloop demo` runs the ops agent end to end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledgerloop.testing.processes import REPO

pytestmark = pytest.mark.e2e


def test_demo_files_exactly_one_ticket_after_approval(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env["LEDGERLOOP_DATABASE_URL"] = db_url
    result = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "demo"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "no ANTHROPIC_API_KEY: scripted model" in out
    assert "action hash" in out
    assert "run succeeded" in out
    assert "tickets filed: 1" in out
