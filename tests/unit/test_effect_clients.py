"""The effect clients keep no cookies: one client serves every run and tenant (the relay's
deliveries and the reconciler's lookups), so nothing a destination sets may ride a later
request. The relay's end-to-end check is in test_effect_relay."""

from __future__ import annotations

import asyncio

import httpx

from ledgerloop.effects.attempts import RelayConfig, http_client, no_cookies
from ledgerloop.effects.transport import LeanClient


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


def test_the_relays_httpx_client_keeps_no_cookie() -> None:
    client = http_client(RelayConfig(transport="httpx"))
    assert isinstance(client, httpx.AsyncClient)
    try:
        client.cookies.extract_cookies(_answer("http://tickets.internal/tickets"))
        assert not list(client.cookies.jar)
    finally:
        asyncio.run(client.aclose())


def test_the_relays_lean_client_has_no_jar_at_all() -> None:
    # The default client sends only what each request carries: there is nowhere a cookie
    # could be kept (test_effect_relay sends through it to a cookie-setting destination).
    client = http_client(RelayConfig())
    assert isinstance(client, LeanClient)
    try:
        assert not hasattr(client, "cookies")
    finally:
        asyncio.run(client.aclose())
