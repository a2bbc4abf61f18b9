"""A project outside the package proves its own agent crash-safe with the pytest plugin alone.

It runs as its owner would run it: its own directory, its own pytest.ini and conftest.py,
nothing of this repository on the path, the plugin found through its entry point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.crash

PROJECT = Path(__file__).resolve().parents[1] / "user_project"


# The whole project in one test: 23 cases, each starting and killing real processes.
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_user_project_passes_the_crash_matrix_and_catches_a_lying_downstream() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LEDGERLOOP_FAULTS")}
    proc = subprocess.run(
        # Three processes (pytest-xdist) share its cases: each waits mostly on the processes it
        # kills and restarts. The plugin's summary line must survive the split.
        [sys.executable, "-m", "pytest", "-q", "-n", "3"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ledgerloop: test Postgres from " in out
    # Every case ran, none skipped: 14 boundaries of the matrix, 4 of its effect boundaries
    # with the relay inside the worker, 2 of compensation, the lying downstream and 3
    # approval-abuse tests.
    assert re.search(r"^23 passed\b", out, re.MULTILINE), out[-2000:]
    # The project imported nothing of this repository's own test suite.
    assert "tests.support" not in out
