"""The crash plugin's own negative controls: an agent with a read tool that sends a refund
(tests/support/leaky_read_agents.py) must make `crash_matrix()` fail, whether the refund goes
to the plugin's recording downstream or to the user's own server reporting what it performed.

Each kills the worker at the one boundary that catches the mistake: after a turn's reads ran,
before their step is recorded. (A read with a side effect passes every other boundary: the
read runs once.) Two cases, each a worker started, killed and started again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.testing.crash import CrashInvariantError, crash_matrix
from tests.support.payments_fake import PaymentsFake

pytestmark = pytest.mark.crash

SUPPORT = Path(__file__).resolve().parents[1] / "support"
AGENT = {
    "agent_modules": ["tests.support.leaky_read_agents"],
    "policy_file": SUPPORT / "leaky_read_policy.yaml",
}
# The model checks the refund (the leaky read), refunds through the outbox, then reports.
SCRIPT = {
    "default": {
        "turns": [
            {"tool_use": {"name": "refund_status", "input": {"order": "A-1"}}},
            {"tool_use": {"name": "issue_refund", "input": {"order": "A-1", "amount_cents": 5000}}},
            {"text": "Refunded 50.00 on order A-1."},
        ]
    }
}
INPUT = {"message": "refund 50 on A-1"}
[READS] = crash_matrix(effects=False, reads=True)
LEAK = 'keyless POST /refunds {"amount_cents": 100, "order": "A-1", "sent_by": "refund_status"}'


def _problems(error: CrashInvariantError) -> list[str]:
    """The invariants that failed, as the error lists them before the timeline."""
    head = str(error).split("\n", 1)[0]
    prefix = f"boundary {READS}: "
    assert head.startswith(prefix), head
    return head[len(prefix) :].split("; ")


def test_a_read_tool_that_sends_a_refund_fails_the_matrix(ledgerloop_crash: Any) -> None:
    harness = ledgerloop_crash(script=SCRIPT, destinations=["payments"], **AGENT)
    with pytest.raises(CrashInvariantError) as caught:
        harness.check(READS, agent="leaky_refunds", input=INPUT)
    assert _problems(caught.value) == [f"logical call {LEAK} was performed 2 times downstream"]
    # What the recorder saw: the leaked refund twice (no key), the real one once (its key).
    keys = [e.key for e in harness.downstream.effects()]
    assert keys.count(None) == 2
    assert len([k for k in keys if k is not None]) == 1


@pytest.fixture
def payments() -> Iterator[PaymentsFake]:
    fake = PaymentsFake().start()
    yield fake
    fake.stop()


def test_the_users_own_downstream_is_counted(ledgerloop_crash: Any, payments: PaymentsFake) -> None:
    harness = ledgerloop_crash(script=SCRIPT, destinations={"payments": payments.url}, **AGENT)
    payments.on_refund = harness.downstream.record
    with pytest.raises(CrashInvariantError) as caught:
        harness.check(READS, agent="leaky_refunds", input=INPUT)
    # The leaked refund, made twice by the user's server, is the one problem: the refund the
    # ledger says succeeded was counted once (not "performed 0 times downstream").
    assert _problems(caught.value) == [f"logical call {LEAK} was performed 2 times downstream"]
    assert len(payments.refunds) == 3
