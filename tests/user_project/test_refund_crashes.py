"""The refund agent survives a SIGKILL at every boundary, a failed run's refund is reversed
even when the reversal is interrupted, and a downstream that only claims to honour idempotency
keys is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerloop.testing.crash import CrashInvariantError, crash_matrix

# The conversation asks for a read tool first (find_order rides think-1), so the kill between
# that read and its step's record is in the matrix, with the kill before the model call.
MATRIX = crash_matrix(
    approval=True,
    reads=True,
    model_call=True,
    steps=["memory-load", "think-0", "think-1", "tool-1-*", "think-2"],
)


# The run fails after refunding (refund_then_outage.yaml), so it crosses the compensation
# boundaries and no others worth repeating here: the effect ones are covered above.
COMPENSATION = crash_matrix(effects=False, compensation=True)


@pytest.mark.parametrize("boundary", MATRIX, ids=str)
def test_refund_survives(boundary: Any, ledgerloop_crash: Any) -> None:
    # A file name is looked up next to this test file.
    harness = ledgerloop_crash(script="refund_conversation.yaml", destinations=["payments"])
    outcome = harness.check(boundary, agent="refunds", input={"message": "refund 50 on A-1"})
    assert outcome.status == "succeeded", outcome.timeline
    [refund] = harness.downstream.effects()
    assert refund.body == {"order": "A-1", "amount_cents": 5000}


@pytest.mark.parametrize("boundary", crash_matrix(), ids=str)
def test_refund_survives_in_one_process(boundary: Any, ledgerloop_crash: Any) -> None:
    """The same effect boundaries with the relay inside the worker (`ledgerloop up`): its act
    step sends the refund itself, and the worker is what dies."""
    harness = ledgerloop_crash(
        script="refund_conversation.yaml", destinations=["payments"], one_process=True
    )
    outcome = harness.check(boundary, agent="refunds", input={"message": "refund 50 on A-1"})
    assert outcome.status == "succeeded", outcome.timeline
    [refund] = harness.downstream.effects()
    assert refund.body == {"order": "A-1", "amount_cents": 5000}


@pytest.mark.parametrize("boundary", COMPENSATION, ids=str)
def test_a_failed_run_reverses_its_refund_once(boundary: Any, ledgerloop_crash: Any) -> None:
    harness = ledgerloop_crash(script="refund_then_outage.yaml", destinations=["payments"])
    outcome = harness.check(boundary, agent="refunds", input={"message": "refund 50 on A-1"})
    assert outcome.status == "failed", outcome.timeline
    refund, reversal = harness.downstream.effects()
    assert refund.body == {"order": "A-1", "amount_cents": 5000}
    assert (reversal.path, reversal.key) == (
        f"/refunds/{refund.id}/reverse",
        f"{refund.key}:compensate",
    )
    assert [e["status"] for e in outcome.effects] == ["succeeded", "succeeded"]


def test_a_downstream_that_ignores_keys_is_caught(
    ledgerloop_crash: Any, conversation: Path
) -> None:
    harness = ledgerloop_crash(script=conversation, destinations=["payments"], honours_keys=False)
    [boundary] = [b for b in MATRIX if b.fault == "relay.after_send_before_record"]
    with pytest.raises(CrashInvariantError) as caught:
        harness.check(boundary, agent="refunds", input={"message": "refund 50 on A-1"})
    message = str(caught.value)
    assert "after sending, before the outcome is stored" in message
    assert "performed 2 times downstream" in message
