"""The ticket service over real HTTP: kinds, idempotency, lookup, fault modes and counting."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.examples.ticket_service import TicketServiceThread

REPO_ROOT = Path(__file__).resolve().parents[2]
TICKET = {"title": "Printer on fire", "body": "third floor", "priority": "high"}


@pytest.fixture(scope="module")
def service() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as svc:
        yield svc


@pytest.fixture
def client(service: TicketServiceThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=5) as c:
        assert c.post("/_reset").status_code == 200
        yield c


def stats(client: httpx.Client) -> dict[str, Any]:
    data: dict[str, Any] = client.get("/_stats").json()
    return data


def arm(client: httpx.Client, **fault: Any) -> None:
    response = client.post("/_faults", json=fault)
    assert response.status_code == 201, response.text


def post(client: httpx.Client, kind: str, key: str | None = None, **body: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(f"/{kind}/tickets", json={**TICKET, **body}, headers=headers)


@pytest.mark.parametrize("kind", ["idempotent", "lookup", "plain"])
def test_create_each_kind(client: httpx.Client, kind: str) -> None:
    response = post(client, kind, key="k-1")

    assert response.status_code == 201
    ticket = response.json()
    assert re.fullmatch(r"TCK-\d{6}", ticket["id"])
    assert ticket["kind"] == kind
    assert (ticket["title"], ticket["priority"]) == ("Printer on fire", "high")
    assert ticket["idempotency_key"] == "k-1"
    assert client.get(f"/tickets/{ticket['id']}").json() == ticket
    counts = stats(client)
    assert counts["created"] == 1
    assert counts["by_kind"][kind] == 1


def test_ids_are_sequential_across_kinds(client: httpx.Client) -> None:
    ids = [post(client, kind).json()["id"] for kind in ("plain", "lookup", "idempotent")]

    assert ids == ["TCK-000001", "TCK-000002", "TCK-000003"]
    assert post(client, "plain").json()["idempotency_key"] is None


def test_unknown_ticket_is_404(client: httpx.Client) -> None:
    assert client.get("/tickets/TCK-999999").status_code == 404
    assert client.get("/healthz").json() == {"status": "ok"}


def test_idempotent_replay_returns_the_original(client: httpx.Client) -> None:
    first = post(client, "idempotent", key="run-1:call-1")
    second = post(client, "idempotent", key="run-1:call-1")

    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    assert second.status_code == 200
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()
    assert stats(client)["created"] == 1
    assert stats(client)["requests"] == 2


def test_idempotent_without_key_creates_every_time(client: httpx.Client) -> None:
    assert post(client, "idempotent").json()["id"] != post(client, "idempotent").json()["id"]
    assert stats(client)["created"] == 2


def test_idempotent_key_reuse_with_another_body_is_422(client: httpx.Client) -> None:
    post(client, "idempotent", key="k")
    reused = post(client, "idempotent", key="k", title="A different ticket")

    assert reused.status_code == 422
    assert reused.json() == {"detail": "Idempotency-Key reused with a different request"}
    assert stats(client)["created"] == 1


def test_idempotent_lookup_by_key(client: httpx.Client) -> None:
    created = post(client, "idempotent", key="run-7:call-3").json()

    found = client.get("/idempotent/tickets/by-key/run-7:call-3")
    assert found.status_code == 200
    assert found.json() == created
    assert client.get("/idempotent/tickets/by-key/k-missing").status_code == 404


def test_lookup_kind_creates_every_time_and_lists_by_key(client: httpx.Client) -> None:
    first = post(client, "lookup", key="k")
    second = post(client, "lookup", key="k")
    post(client, "lookup", key="other")

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    found = client.get("/lookup/tickets/by-key/k")
    assert found.status_code == 200
    assert found.json() == {"tickets": [first.json(), second.json()]}
    assert client.get("/lookup/tickets/by-key/missing").status_code == 404
    assert stats(client)["by_kind"]["lookup"] == 3


def test_plain_kind_has_no_lookup_and_no_idempotency(client: httpx.Client) -> None:
    post(client, "plain", key="k")
    post(client, "plain", key="k")

    assert client.get("/plain/tickets/by-key/k").status_code in (404, 405)
    assert stats(client)["by_kind"]["plain"] == 2


def test_slow_commits_although_the_client_times_out(client: httpx.Client) -> None:
    arm(client, mode="slow", delay_ms=400)

    with pytest.raises(httpx.TimeoutException):
        client.post("/lookup/tickets", json=TICKET, headers={"Idempotency-Key": "k"}, timeout=0.1)

    assert stats(client)["created"] == 1
    assert len(client.get("/lookup/tickets/by-key/k").json()["tickets"]) == 1


@pytest.mark.parametrize(("mode", "status"), [("fail_before_commit", 503), ("rate_limit", 429)])
def test_refusals_create_nothing(client: httpx.Client, mode: str, status: int) -> None:
    arm(client, mode=mode)

    refused = post(client, "idempotent", key="k")
    assert refused.status_code == status
    assert refused.headers["Retry-After"] == "0"
    assert stats(client)["created"] == 0
    assert client.get("/idempotent/tickets/by-key/k").status_code == 404

    # The fault is spent: a retry with the same key now creates the ticket.
    assert post(client, "idempotent", key="k").status_code == 201
    assert stats(client) == {
        "created": 1,
        "by_kind": {"idempotent": 1, "lookup": 0, "plain": 0},
        "requests": 2,
        "closed": 0,
    }


def test_commit_then_drop_counts_the_ticket_but_answers_nothing(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    arm(client, mode="commit_then_drop")

    with caplog.at_level(logging.ERROR), pytest.raises(httpx.RemoteProtocolError):
        post(client, "idempotent", key="k")

    assert stats(client)["created"] == 1
    # The drop is deliberate, so the server must not log it as an application crash.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # A relay resending with the same key gets the committed ticket, not a second one.
    replay = post(client, "idempotent", key="k")
    assert replay.status_code == 200
    assert replay.json()["id"] == "TCK-000001"
    assert stats(client)["created"] == 1


def test_garbage_commits_and_answers_non_json(client: httpx.Client) -> None:
    arm(client, mode="garbage")

    response = post(client, "plain")

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()
    assert stats(client)["created"] == 1


def test_fault_restricted_to_a_kind(client: httpx.Client) -> None:
    arm(client, mode="fail_before_commit", kind="lookup")

    assert post(client, "plain").status_code == 201
    assert post(client, "idempotent").status_code == 201
    assert post(client, "lookup").status_code == 503
    assert post(client, "lookup").status_code == 201
    assert stats(client)["by_kind"] == {"idempotent": 1, "lookup": 1, "plain": 1}


def test_first_matching_fault_wins(client: httpx.Client) -> None:
    arm(client, mode="rate_limit", kind="lookup")
    arm(client, mode="fail_before_commit")

    assert post(client, "plain").status_code == 503
    assert post(client, "lookup").status_code == 429
    assert client.get("/_faults").json() == {"faults": []}


def test_fault_count_is_consumed_per_request(client: httpx.Client) -> None:
    arm(client, mode="fail_before_commit", count=2)

    assert [post(client, "plain").status_code for _ in range(3)] == [503, 503, 201]
    assert stats(client)["requests"] == 3
    assert stats(client)["created"] == 1


def test_delete_faults_disarms_them(client: httpx.Client) -> None:
    arm(client, mode="rate_limit", count=5)

    assert client.delete("/_faults").status_code == 200
    assert client.get("/_faults").json() == {"faults": []}
    assert post(client, "plain").status_code == 201


@pytest.mark.parametrize(
    "fault",
    [{"mode": "explode"}, {"mode": "slow"}, {"mode": "rate_limit", "count": 0}, {"kind": "x"}],
)
def test_bad_fault_is_422(client: httpx.Client, fault: dict[str, Any]) -> None:
    assert client.post("/_faults", json=fault).status_code == 422
    assert client.get("/_faults").json() == {"faults": []}


@pytest.mark.parametrize(
    "body",
    [
        {"title": "", "body": "", "priority": "low"},
        {"title": "x" * 201, "body": "", "priority": "low"},
        {"title": "ok", "body": "", "priority": "urgent"},
        {"body": "no title", "priority": "low"},
        {"title": "ok", "body": "", "priority": "low", "assignee": "me"},
    ],
)
def test_invalid_body_is_422_and_creates_nothing(
    client: httpx.Client, body: dict[str, Any]
) -> None:
    for kind in ("idempotent", "lookup", "plain"):
        assert client.post(f"/{kind}/tickets", json=body).status_code == 422
    assert stats(client)["created"] == 0


def test_reset_clears_tickets_faults_and_counts(client: httpx.Client) -> None:
    post(client, "idempotent", key="k")
    post(client, "lookup", key="k")
    arm(client, mode="rate_limit")

    assert client.post("/_reset").status_code == 200

    assert stats(client) == {
        "created": 0,
        "by_kind": {"idempotent": 0, "lookup": 0, "plain": 0},
        "requests": 0,
        "closed": 0,
    }
    assert client.get("/_faults").json() == {"faults": []}
    assert client.get("/idempotent/tickets/by-key/k").status_code == 404
    assert client.get("/lookup/tickets/by-key/k").status_code == 404
    assert client.get("/tickets/TCK-000001").status_code == 404
    assert post(client, "plain").json()["id"] == "TCK-000001"


def test_thread_has_its_own_state_and_releases_its_port(client: httpx.Client) -> None:
    post(client, "plain")
    other = TicketServiceThread()
    other.start()
    try:
        assert other.port != 0
        assert httpx.get(f"{other.url}/_stats").json()["created"] == 0
    finally:
        other.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{other.url}/healthz")
    assert stats(client)["created"] == 1


def test_module_entry_point_serves_and_stops_cleanly_on_sigint() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "ledgerloop.examples.ticket_service", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            match = re.fullmatch(r"ticket service listening on (http://127\.0\.0\.1:\d+)", line)
            assert match, line
            assert httpx.post(f"{match[1]}/plain/tickets", json=TICKET).status_code == 201
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_close_is_idempotent_and_counted() -> None:
    with TicketServiceThread() as service, httpx.Client(base_url=service.url) as client:
        created = client.post("/plain/tickets", json={"title": "t"}).json()
        first = client.post(f"/tickets/{created['id']}/close")
        again = client.post(f"/tickets/{created['id']}/close")
        assert first.json() == {"id": created["id"], "closed": True, "already_closed": False}
        assert again.json()["already_closed"] is True
        assert client.post("/tickets/TCK-999999/close").status_code == 404
        assert client.get("/_stats").json()["closed"] == 1
