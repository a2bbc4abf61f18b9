"""Approval decisions delivered twice, in reverse order and after expiry never move the refund
run wrongly: one refund at most, and only for an approval that was applied in time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MESSAGE = {"message": "refund 50 on A-1"}


def test_a_decision_delivered_twice_refunds_once(ledgerloop_crash: Any, conversation: Path) -> None:
    harness = ledgerloop_crash(script=conversation, destinations=["payments"])
    run = harness.start(agent="refunds", input=MESSAGE)
    approval = harness.wait_for_approval(run)
    first, second = harness.events.twice(approval, "approve")
    assert (first.answer, second.answer) == ("applied", "duplicate")
    assert harness.settle(run).status == "succeeded"
    assert len(harness.downstream.effects()) == 1


def test_a_late_approval_after_a_rejection_is_refused(
    ledgerloop_crash: Any, conversation: Path
) -> None:
    harness = ledgerloop_crash(script=conversation, destinations=["payments"])
    run = harness.start(agent="refunds", input=MESSAGE)
    approval = harness.wait_for_approval(run)
    rejected, approved = harness.events.reversed(approval, "reject", "approve")
    assert rejected.answer == "applied"
    assert approved.answer == "refused", approved
    assert harness.settle(run).status == "cancelled"  # the policy says on_reject: cancel
    assert harness.downstream.effects() == []


def test_an_approval_after_expiry_is_refused(ledgerloop_crash: Any, conversation: Path) -> None:
    harness = ledgerloop_crash(
        script=conversation, destinations=["payments"], policy_file="policy_short_ttl.yaml"
    )
    run = harness.start(agent="refunds", input=MESSAGE)
    approval = harness.wait_for_approval(run)
    late = harness.events.after_expiry(approval, "approve")
    assert late.answer == "refused", late
    assert "expired" in late.reason
    assert harness.settle(run).status == "cancelled"  # on_timeout: cancel
    assert harness.downstream.effects() == []
