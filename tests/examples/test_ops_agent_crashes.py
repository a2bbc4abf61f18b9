"""The example ops agent through the full crash matrix, written as a user would write it: the
plugin's fixtures and the crash harness, nothing of Ledgerloop's internals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerloop.testing.crash import crash_matrix

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "app" / "ledgerloop" / "models" / "scripts" / "ops_demo.yaml"

# search_kb is a read tool: it rides think-1, so the kill between it and that step's record
# is in the matrix, as docs/testing.md asks of any conversation with reads.
MATRIX = crash_matrix(
    approval=True,
    reads=True,
    steps=["memory-load", "think-0", "think-1", "tool-1-*", "think-2"],
)


@pytest.mark.parametrize("boundary", MATRIX, ids=str)
def test_ops_agent_survives(boundary: Any, ledgerloop_crash: Any) -> None:
    harness = ledgerloop_crash(
        script=SCRIPT,
        destinations=["tickets"],
        agent_modules=["ledgerloop.examples.ops_agent"],
        policy_file=REPO / "tool_policy.yaml",
    )
    outcome = harness.check(boundary, agent="ops", input={"message": "db-1 disk is full"})
    assert outcome.status == "succeeded", outcome.timeline
    [ticket] = harness.downstream.effects()
    assert ticket.body["title"] == "db-1 disk full"
