"""The recording downstream that users' crash tests count side effects with: every delivery is
counted, keyed or not, and a downstream of the user's own can report what it performed.

Requests go over real HTTP to the recorder, as the relay's and a read tool's would."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ledgerloop.testing.downstream import RecordingDownstream

REFUND = {"order": "A-1", "amount_cents": 5000}


@pytest.fixture
def downstream() -> Iterator[RecordingDownstream]:
    with RecordingDownstream() as recorder:
        yield recorder


def _post(downstream: RecordingDownstream, body: object, key: str | None = None) -> int:
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(f"{downstream.url}/refunds", json=body, headers=headers).status_code


def test_the_same_keyless_request_twice_is_a_duplicate(downstream: RecordingDownstream) -> None:
    assert _post(downstream, REFUND) == 201
    assert _post(downstream, REFUND) == 201
    assert len(downstream.effects()) == 2
    assert downstream.duplicates() == {
        'keyless POST /refunds {"amount_cents": 5000, "order": "A-1"}': 2
    }


def test_different_keyless_requests_are_different_calls(downstream: RecordingDownstream) -> None:
    _post(downstream, REFUND)
    _post(downstream, {**REFUND, "amount_cents": 2000})
    assert downstream.duplicates() == {}


def test_a_repeated_key_is_answered_once(downstream: RecordingDownstream) -> None:
    assert _post(downstream, REFUND, "run:call-1") == 201
    assert _post(downstream, REFUND, "run:call-1") == 200
    assert [e.key for e in downstream.effects()] == ["run:call-1"]
    assert downstream.duplicates(ledger_keys={"run:call-1"}) == {}


def test_keys_the_ledger_does_not_know_are_counted_by_request(
    downstream: RecordingDownstream,
) -> None:
    # A read tool that makes up a fresh key each time it runs: two keys, one refund asked twice.
    _post(downstream, REFUND, "made-up-1")
    _post(downstream, REFUND, "made-up-2")
    assert downstream.duplicates() == {}  # by key alone, nothing to see
    [(call, count)] = downstream.duplicates(ledger_keys={"run:call-1"}).items()
    assert count == 2
    assert call.startswith('POST /refunds {"amount_cents": 5000, "order": "A-1"}')


def test_a_users_own_downstream_reports_what_it_performed(
    downstream: RecordingDownstream,
) -> None:
    performed = {"method": "POST", "path": "/refunds", "key": "run:call-1", "body": REFUND}
    answer = httpx.post(downstream.report_url, json=performed)
    assert answer.status_code == 201
    downstream.record("POST", "/refunds", None, REFUND)
    downstream.record("POST", "/refunds", None, REFUND)
    assert [(e.key, e.body) for e in downstream.effects()] == [
        ("run:call-1", REFUND),
        (None, REFUND),
        (None, REFUND),
    ]
    assert downstream.count_by_key()["run:call-1"] == 1
    assert list(downstream.duplicates().values()) == [2]
    # A report that is not one is refused, and counts nothing.
    assert httpx.post(downstream.report_url, json={"key": 3}).status_code == 400
    assert len(downstream.effects()) == 3


def test_gets_are_counted_by_path(downstream: RecordingDownstream) -> None:
    assert httpx.get(f"{downstream.url}/docs/a/run:call-1").status_code == 404
    assert httpx.get(f"{downstream.url}/docs/a/run:call-1").status_code == 404
    assert httpx.get(f"{downstream.url}/docs/b/run:call-2").status_code == 404
    assert downstream.gets_by_path() == {"/docs/a/run:call-1": 2, "/docs/b/run:call-2": 1}
    downstream.reset()
    assert downstream.gets_by_path() == {}
