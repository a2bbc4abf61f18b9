"""A write recorded ahead has its delivery built while its record commits (Relay.prepare):
what the relay sends then is the row's own request, once, and a preparation that does not
match, or is not used, sends nothing and gives its connection back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ledgerloop.effects.outbox import Claimed
from ledgerloop.effects.relay import Relay
from tests.integration.test_effect_transport import Server, _headers, ok

TOOL = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _request(body: dict[str, Any]) -> dict[str, Any]:
    return {"path": "/t", "body": body, "honours_idempotency": True, "traceparent": TOOL}


def _claimed(key: str, request: dict[str, Any]) -> Claimed:
    # A row no table holds: its outcome's record finds nothing to settle (owned: False).
    return Claimed(
        outbox_id=-1,
        key=key,
        destination="tickets",
        request=request,
        attempts=1,
        deadline_in_s=60.0,
        effect_attempts=1,
        compensates=None,
        claimed_at=time.monotonic(),
    )


def test_a_prepared_delivery_sends_the_rows_request_once(db_url: str) -> None:
    async def go() -> None:
        async with Server(ok(), ok()) as server, Relay(db_url, {"tickets": server.url}) as relay:
            request = _request({"n": 1})
            prepared = await relay.prepare("run:call-1", "tickets", request)
            assert prepared is not None
            assert server.requests == []  # built, connected, not sent
            sent = await relay.send_now(_claimed("run:call-1", request), prepared=_ready(prepared))
            assert sent is not None
            outcome, recorded = sent
            assert outcome.status.value == "succeeded"
            assert await recorded is False  # no such row: someone else's to settle
            (only,) = server.requests
            headers = dict(_headers(only))
            assert headers["idempotency-key"] == "run:call-1"
            assert headers["traceparent"] == prepared.planned.headers["traceparent"]
            assert only.endswith(b'{"n":1}')
            assert server.connections == 1

    asyncio.run(go())


def test_a_preparation_for_another_request_is_given_back_unsent(db_url: str) -> None:
    async def go() -> None:
        async with Server(ok()) as server, Relay(db_url, {"tickets": server.url}) as relay:
            stale = await relay.prepare("run:call-1", "tickets", _request({"n": 1}))
            assert stale is not None
            row = _request({"n": 2})
            sent = await relay.send_now(_claimed("run:call-1", row), prepared=_ready(stale))
            assert sent is not None
            (only,) = server.requests
            assert only.endswith(b'{"n":2}')
            # The stale preparation's connection was closed unsent; the row's went on another.
            assert server.connections == 2

    asyncio.run(go())


def test_nothing_is_prepared_for_what_the_relay_cannot_send_that_way(db_url: str) -> None:
    async def go() -> None:
        async with Server() as server, Relay(db_url, {"tickets": server.url}) as relay:
            mcp = {**_request({}), "mcp_tool": "create_ticket"}
            assert await relay.prepare("k", "tickets", mcp) is None
            assert await relay.prepare("k", "elsewhere", _request({})) is None
            assert await relay.prepare("k", "tickets", {"path": "no-slash"}) is None
            assert (
                await relay.prepare("k", "tickets", {**_request({}), "traceparent": None}) is None
            )
            assert server.connections == 0

    asyncio.run(go())


async def _ready(value: Any) -> Any:
    return value
