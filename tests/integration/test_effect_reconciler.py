"""The reconciler and operator resolution against the real ticket service.

Unknown outcomes are produced the real way: the ticket service commits and then drops the
connection, or a relay process is killed at a named fault point.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psycopg
import pytest

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.effects.errors import RetryUnsafe
from ledgerloop.effects.hashing import request_hash
from ledgerloop.effects.ledger import Effect, effect_begin, effect_get, effect_resolve
from ledgerloop.effects.messages import EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import connect_async, outbox_claim
from ledgerloop.effects.reconciler import Reconciler, Unsettled, reconcile_once, run_reconciler
from ledgerloop.effects.relay import RelayConfig
from ledgerloop.effects.testing import act_event, drain_outbox, messages_for, workflow_row
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.store import run_create
from ledgerloop.testing.postgres import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
BODY = {"title": "Printer on fire", "body": "third floor", "priority": "high"}
FAST = RelayConfig(backoff_base_s=0.01, settle_after_s=0)

# The three downstreams, as a tool policy would describe them.
IDEMPOTENT = {
    "path": "/idempotent/tickets",
    "honours_idempotency": True,
    "lookup_path": "/idempotent/tickets/by-key/{key}",
}
IDEMPOTENT_NO_LOOKUP = {"path": "/idempotent/tickets", "honours_idempotency": True}
LOOKUP = {"path": "/lookup/tickets", "lookup_path": "/lookup/tickets/by-key/{key}"}
PLAIN = {"path": "/plain/tickets"}


@pytest.fixture(scope="module")
def service() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as svc:
        yield svc


@pytest.fixture
def tickets(service: TicketServiceThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=5) as client:
        assert client.post("/_reset").status_code == 200
        yield client


@pytest.fixture
def destinations(service: TicketServiceThread) -> dict[str, str]:
    return {"tickets": service.url}


def begin(conn: Conn, kind: dict[str, Any], **overrides: Any) -> Effect:
    run_id = run_create(conn, agent="ops", input={})[0].id
    workflow_row(conn, run_id)
    act_event(conn, run_id, f"{run_id}:call-1")
    request = {**kind, "body": BODY, **overrides}
    return effect_begin(
        conn,
        key=f"{run_id}:call-1",
        run_id=run_id,
        tenant_id=DEFAULT_TENANT,
        tool="write_ticket",
        request_hash=request_hash("write_ticket", request, "tickets", "v1"),
        destination="tickets",
        request=request,
    )


def unknown_after_commit(
    conn: Conn,
    db_url: str,
    tickets: httpx.Client,
    destinations: dict[str, str],
    kind: dict[str, Any],
    **overrides: Any,
) -> Effect:
    """An effect whose ticket exists but whose answer was lost."""
    tickets.post("/_faults", json={"mode": "commit_then_drop"})
    effect = begin(conn, kind, **overrides)
    drain_outbox(db_url, destinations, FAST)
    assert get(conn, effect).status == EffectStatus.OUTCOME_UNKNOWN
    assert stats(tickets)["created"] == 1
    return effect


def reconcile(db_url: str, destinations: dict[str, str]) -> int:
    return asyncio.run(reconcile_once(db_url, destinations))


def get(conn: Conn, effect: Effect) -> Effect:
    found = effect_get(conn, effect.key)
    assert found is not None
    return found


def stats(tickets: httpx.Client) -> dict[str, Any]:
    data: dict[str, Any] = tickets.get("/_stats").json()
    return data


def statuses(conn: Conn, effect: Effect) -> list[str]:
    return [m["message"]["status"] for m in messages_for(conn, effect.run_id, effect.key)]


def outbox(conn: Conn, key: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT * FROM ledgerloop.outbox WHERE idempotency_key = %s", (key,)
    ).fetchone()
    assert row is not None
    return row


def relay_died_after_claiming(conn: Conn, db_url: str, effect: Effect) -> None:
    """What a relay killed before sending leaves behind, with its lease already run out."""

    async def claim() -> None:
        db = await connect_async(db_url)
        async with db:
            assert len(await outbox_claim(db, limit=10, lease_margin_s=5)) == 1

    asyncio.run(claim())
    assert get(conn, effect).status == EffectStatus.STARTED
    # The clock moves past the lease.
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET lease_until = now() WHERE idempotency_key = %s",
        (effect.key,),
    )


def test_idempotent_kind_settles_by_lookup_without_resending(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, IDEMPOTENT)

    assert reconcile(db_url, destinations) == 1

    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert done.result["id"] == "TCK-000001"
    assert stats(tickets)["created"] == 1
    assert stats(tickets)["requests"] == 1  # found by lookup, nothing sent again
    assert statuses(conn, effect) == ["outcome_unknown", "succeeded"]
    assert reconcile(db_url, destinations) == 0


def test_idempotent_kind_without_lookup_resends_with_the_same_key(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, IDEMPOTENT_NO_LOOKUP)

    assert reconcile(db_url, destinations) == 1
    assert get(conn, effect).status == EffectStatus.PENDING
    assert outbox(conn, effect.key)["status"] == OutboxStatus.PENDING
    drain_outbox(db_url, destinations, FAST)

    done = get(conn, effect)
    assert (done.status, done.attempts) == (EffectStatus.SUCCEEDED, 2)
    assert done.external_reference == "TCK-000001"  # the destination replayed the original
    assert stats(tickets)["created"] == 1
    assert stats(tickets)["requests"] == 2
    assert statuses(conn, effect) == ["outcome_unknown", "succeeded"]


def test_lookup_kind_settles_by_lookup_without_resending(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, LOOKUP)

    assert reconcile(db_url, destinations) == 1

    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert stats(tickets) == {
        "created": 1,
        "by_kind": {"idempotent": 0, "lookup": 1, "plain": 0},
        "requests": 1,
        "closed": 0,
    }
    assert statuses(conn, effect) == ["outcome_unknown", "succeeded"]


def test_lookup_finding_several_is_succeeded_with_the_evidence(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, LOOKUP)
    # Someone else sent the same key again (a resend by hand, an older relay).
    tickets.post("/lookup/tickets", json=BODY, headers={"Idempotency-Key": effect.key})

    assert reconcile(db_url, destinations) == 1

    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert done.evidence is not None
    assert done.evidence["reconciler"]["duplicates"] == ["TCK-000002"]


def test_plain_kind_needs_a_human_with_the_evidence(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, PLAIN)

    assert reconcile(db_url, destinations) == 1

    parked = get(conn, effect)
    assert parked.status == EffectStatus.NEEDS_HUMAN
    assert "neither honours idempotency keys nor offers a lookup" in (parked.error or "")
    assert f"destinations.{effect.destination} in the policy file" in (parked.error or "")
    assert parked.evidence is not None
    evidence = parked.evidence["reconciler"]
    assert "RemoteProtocolError" in evidence["last_error"]
    assert evidence["attempts"] == 1
    assert evidence["request"]["path"] == "/plain/tickets"
    assert stats(tickets)["requests"] == 1
    assert statuses(conn, effect) == ["outcome_unknown", "needs_human"]
    [*_, message] = messages_for(conn, effect.run_id, effect.key)
    assert message["message"]["error"] == parked.error

    # A person may not ask for an automatic retry here...
    with pytest.raises(
        RetryUnsafe, match="no automatic retry where the policy says it is unsafe"
    ) as refused:
        effect_resolve(conn, effect.key, retry=True, operator="ops@example.com")
    # ...and is told where the destination's behaviour is declared.
    assert f"destinations.{effect.destination} entry" in refused.value.message
    assert "docs/policy.md" in (refused.value.fix or "")
    # ...but may say what they found.
    resolved = effect_resolve(
        conn, effect.key, succeeded_ref="TCK-000001", operator="ops@example.com"
    )
    assert (resolved.status, resolved.external_reference, resolved.resolved_by) == (
        EffectStatus.SUCCEEDED,
        "TCK-000001",
        "ops@example.com",
    )
    assert statuses(conn, effect) == ["outcome_unknown", "needs_human", "succeeded"]
    assert stats(tickets)["created"] == 1


def test_a_person_can_resolve_as_failed(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, PLAIN)

    resolved = effect_resolve(
        conn, effect.key, failed_reason="ticket was never filed", operator="ops@example.com"
    )

    assert resolved.status == EffectStatus.FAILED
    assert resolved.error == "resolved as failed by ops@example.com: ticket was never filed"
    assert resolved.evidence is not None
    assert resolved.evidence["resolution"]["from_status"] == "outcome_unknown"
    [*_, message] = messages_for(conn, effect.run_id, effect.key)
    assert message["message"]["status"] == "failed"
    assert message["message"]["error"] == resolved.error


def test_nothing_committed_is_proven_by_lookup_and_resent(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = begin(conn, LOOKUP)
    relay_died_after_claiming(conn, db_url, effect)

    assert reconcile(db_url, destinations) == 1  # lookup: 404 -> send again
    assert get(conn, effect).status == EffectStatus.PENDING
    drain_outbox(db_url, destinations, FAST)

    done = get(conn, effect)
    assert (done.status, done.attempts) == (EffectStatus.SUCCEEDED, 2)
    assert stats(tickets)["created"] == 1
    assert statuses(conn, effect) == ["succeeded"]


def test_nothing_committed_and_no_attempts_left_fails(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = begin(conn, LOOKUP, max_attempts=1)
    relay_died_after_claiming(conn, db_url, effect)

    assert reconcile(db_url, destinations) == 1

    done = get(conn, effect)
    assert done.status == EffectStatus.FAILED
    assert "found nothing, so it never happened" in (done.error or "")
    assert outbox(conn, effect.key)["status"] == OutboxStatus.DEAD
    assert stats(tickets)["created"] == 0


def test_spent_budget_needs_a_human_who_may_retry(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(
        conn, db_url, tickets, destinations, IDEMPOTENT_NO_LOOKUP, max_attempts=1
    )

    assert reconcile(db_url, destinations) == 1
    parked = get(conn, effect)
    assert parked.status == EffectStatus.NEEDS_HUMAN
    assert "all 1 of 1 attempts are spent" in (parked.error or "")

    retried = effect_resolve(conn, effect.key, retry=True, operator="ops@example.com")
    assert (retried.status, retried.resolved_by) == (EffectStatus.PENDING, "ops@example.com")
    assert outbox(conn, effect.key)["attempts"] == 0  # a new budget
    drain_outbox(db_url, destinations, FAST)

    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert stats(tickets)["created"] == 1
    assert statuses(conn, effect) == ["outcome_unknown", "needs_human", "succeeded"]


def test_an_unreadable_lookup_needs_a_human_and_a_retry_looks_again(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    # A lookup that answers 200 with nothing the reconciler can read.
    effect = unknown_after_commit(
        conn, db_url, tickets, destinations, LOOKUP, lookup_path="/_stats?key={key}"
    )

    assert reconcile(db_url, destinations) == 1
    parked = get(conn, effect)
    assert parked.status == EffectStatus.NEEDS_HUMAN
    assert "cannot read" in (parked.error or "")

    retried = effect_resolve(conn, effect.key, retry=True, operator="ops@example.com")
    # With a lookup, a retry goes back to the reconciler, which looks before it sends.
    assert retried.status == EffectStatus.OUTCOME_UNKNOWN
    assert reconcile(db_url, destinations) == 1
    assert get(conn, effect).status == EffectStatus.NEEDS_HUMAN
    assert stats(tickets)["requests"] == 1  # never sent blind


def test_a_lookup_that_cannot_answer_is_asked_again_later(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, LOOKUP)
    with TicketServiceThread() as gone:
        closed = {"tickets": gone.url}

    assert reconcile(db_url, closed) == 0

    waiting = get(conn, effect)
    assert waiting.status == EffectStatus.OUTCOME_UNKNOWN
    assert waiting.lease_until is not None
    assert waiting.lease_until > waiting.updated_at  # not due again for a while
    assert waiting.evidence is not None
    assert waiting.evidence["reconciler"]["last_lookup"]["answer"] == "transient"
    assert reconcile(db_url, destinations) == 0  # the lease holds it for now


CRASHING_RELAY = """
import asyncio, json, sys
from ledgerloop.effects.relay import RelayConfig, run_relay
config = RelayConfig(lease_margin_s=0)
asyncio.run(run_relay(sys.argv[1], json.loads(sys.argv[2]), stop=asyncio.Event(), config=config))
"""


@pytest.mark.parametrize(
    ("fault", "kind", "created_by_crash", "requests"),
    [
        ("relay.before_send", LOOKUP, 0, 1),  # lookup: 404 -> resend
        ("relay.after_send_before_record", LOOKUP, 1, 1),  # lookup: found
        ("relay.after_send_before_record", IDEMPOTENT_NO_LOOKUP, 1, 2),  # resend, replayed
    ],
)
def test_a_relay_killed_mid_delivery_is_settled_exactly_once(
    conn: Conn,
    db_url: str,
    tickets: httpx.Client,
    destinations: dict[str, str],
    fault: str,
    kind: dict[str, Any],
    created_by_crash: int,
    requests: int,
) -> None:
    effect = begin(conn, kind, timeout_ms=300)

    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_RELAY, db_url, json.dumps(destinations)],
        env={**os.environ, "LEDGERLOOP_FAULTS": fault},
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )

    assert crashed.returncode == -9, crashed.stderr
    started = get(conn, effect)
    assert (started.status, started.attempts) == (EffectStatus.STARTED, 1)
    assert stats(tickets)["created"] == created_by_crash
    # The lease (the 300 ms timeout, no margin) runs out; then the reconciler takes it.
    wait_until(lambda: reconcile(db_url, destinations) == 1, timeout=10)
    drain_outbox(db_url, destinations, FAST)

    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert stats(tickets)["created"] == 1
    assert stats(tickets)["requests"] == requests
    assert statuses(conn, effect) == ["succeeded"]


def test_the_reconciler_service_settles_and_stops(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, IDEMPOTENT)

    async def serve() -> None:
        stop = asyncio.Event()
        service = asyncio.create_task(
            run_reconciler(db_url, destinations, stop=stop, interval_s=30)
        )
        await asyncio.to_thread(
            wait_until, lambda: get(conn, effect).status == EffectStatus.SUCCEEDED, 5
        )
        stop.set()
        await asyncio.wait_for(service, 5)

    asyncio.run(serve())
    assert stats(tickets)["created"] == 1


class _CookieSettingLookup(BaseHTTPRequestHandler):
    """A destination whose lookup finds the ticket and sets a session cookie, and remembers
    the Cookie header each lookup brought."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Cookie"))
        body = json.dumps({"id": f"t-{len(type(self).seen)}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=first-lookups-session; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_lookups_cookie_never_goes_out_with_another_lookup(conn: Conn, db_url: str) -> None:
    """One reconciler looks up every run's and tenant's effects with one HTTP client: a
    cookie one lookup was given must not ride the next."""
    _CookieSettingLookup.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CookieSettingLookup)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    destinations = {"tickets": f"http://127.0.0.1:{server.server_address[1]}"}

    async def three_lookups() -> list[Effect]:
        settled = []
        # One reconciler for all three, one after another: its client would have kept it.
        async with Reconciler(db_url, destinations) as reconciler:
            for _ in range(3):
                effect = begin(conn, LOOKUP)
                # It runs its own event loop: on a thread of its own.
                await asyncio.to_thread(relay_died_after_claiming, conn, db_url, effect)
                assert await reconciler.reconcile_once() == 1
                settled.append(get(conn, effect))
        return settled

    try:
        settled = asyncio.run(three_lookups())
    finally:
        server.shutdown()
        server.server_close()
    assert [e.status for e in settled] == [EffectStatus.SUCCEEDED] * 3
    assert _CookieSettingLookup.seen == [None, None, None]


def test_a_verdict_whose_save_failed_is_saved_without_asking_the_destination_again(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = unknown_after_commit(conn, db_url, tickets, destinations, LOOKUP)

    async def go() -> None:
        async with Reconciler(db_url, destinations) as reconciler:
            db = reconciler._db()
            cursor = await db.execute(
                "SELECT e.*, o.request, o.attempts AS budget_attempts, "
                "o.last_error AS outbox_last_error, 0.0::float8 AS deadline_in_s "
                "FROM ledgerloop.activity_effect e JOIN ledgerloop.outbox o "
                "USING (idempotency_key) WHERE e.idempotency_key = %s",
                (effect.key,),
            )
            row = await cursor.fetchone()
            assert row is not None
            unsettled = Unsettled.from_row(row)
            # The lookup answers; the connection the verdict is saved on is gone (a failover).
            await db.close()
            with pytest.raises(psycopg.OperationalError):
                await reconciler._reconcile(unsettled)
            # Back, with the destination now unreachable: asked again, it could not answer
            # (the effect would be deferred); the answer received is used instead.
            reconciler._conn = await connect_async(db_url)
            reconciler.destinations = {"tickets": "http://127.0.0.1:9"}
            assert await reconciler._reconcile(unsettled) is True
            assert reconciler._answers == {}

    asyncio.run(go())
    done = get(conn, effect)
    assert (done.status, done.external_reference) == (EffectStatus.SUCCEEDED, "TCK-000001")
    assert stats(tickets)["requests"] == 1
