"""The two-agent example orchestration (ledgerloop.examples.review_flow) through the crash
matrix: the worker killed after each of its steps, researcher's and reviewer's alike, then
restarted; the run must end as it would have, with the invariants the harness checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerloop.testing.crash import crash_matrix

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[2]

SCRIPT = {
    "conversations": [
        {
            "match": "Review this answer",
            "turns": [{"text": "APPROVED: it cites the disk-full runbook"}],
        }
    ],
    "default": {
        "turns": [
            {"tool_use": {"name": "search_kb", "input": {"query": "disk full"}}},
            {"text": "Check pg_wal and old base backups (runbook disk-full)."},
        ]
    },
}

MATRIX = crash_matrix(
    effects=False,
    steps=[
        "memory-load",
        "think-0",
        "tool-0-*",
        "memory-save-0",
        "think-1",
        "review.think-0",
        # Not memory-save-1: it commits the run's success, so nothing is left to resume.
    ],
)


@pytest.mark.parametrize("boundary", MATRIX, ids=str)
def test_review_flow_survives(boundary: Any, ledgerloop_crash: Any) -> None:
    harness = ledgerloop_crash(
        script=SCRIPT,
        agent_modules=["ledgerloop.examples.review_flow"],
        policy_file=REPO / "tool_policy.yaml",
    )
    outcome = harness.check(boundary, agent="researcher", input={"message": "db-1 disk is full"})
    assert outcome.status == "succeeded", outcome.timeline
    assert outcome.state["review"].startswith("APPROVED"), outcome.timeline
