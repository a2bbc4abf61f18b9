"""The effect clients keep no cookies: one client serves every run and tenant (the relay's
deliveries and the reconciler's lookups), so nothing a destination sets may ride a later
request. The relay's end-to-end check is in test_effect_relay."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ledgerloop.effects.attempts import RelayConfig, http_client, no_cookies


def _answer(url: str) -> httpx.Response:
    return httpx.Response(
        200,
        headers={"set-cookie": "session=first-callers; Path=/"},
        request=httpx.Request("POST", url),
    )


def test_a_set_cookie_answer_leaves_the_jar_empty() -> None:
    cookies = httpx.Cookies(no_cookies())
    cookies.extract_cookies(_answer("http://tickets.internal/tickets"))
    assert not list(cookies.jar)


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_the_relays_client_keeps_no_cookie(transport: str) -> None:
    client = http_client(RelayConfig(transport=transport))  # type: ignore[arg-type]
    try:
        client.cookies.extract_cookies(_answer("http://tickets.internal/tickets"))
        assert not list(client.cookies.jar)
    finally:
        asyncio.run(client.aclose())
