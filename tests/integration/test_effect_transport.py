"""The relay's lean HTTP/1.1 transport against a real socket server that answers byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import pytest

from ledgerloop.effects.delivery import Delivery, Verdict, send
from ledgerloop.effects.messages import DeliveryRequest
from ledgerloop.effects.transport import Answer as Answered
from ledgerloop.effects.transport import LeanClient, LeanTransport
from ledgerloop.version import __version__

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


class Server:
    """Answers each request with the next canned answer; counts connections and requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""
        self.hung_up = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                try:
                    self.requests.append(await read_request(reader))
                except asyncio.IncompleteReadError:
                    return
                keep_open = await self.answers.pop(0)(reader, writer)
                if not keep_open:
                    return
        finally:
            writer.close()
            await writer.wait_closed()
            self.hung_up.set()


def raw(data: bytes, *, keep_open: bool = True, delay: float = 0) -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(delay)
        writer.write(data)
        await writer.drain()
        return keep_open

    return answer


def ok(body: bytes = b'{"id":"T-1"}', extra: bytes = b"") -> Answer:
    return raw(
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def post(transport: LeanTransport, url: str, timeout: float = 2.0) -> httpx.Response:
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        return await client.post(url + "/t", json={"a": 1}, headers={"Idempotency-Key": "k"})


async def lean_post(
    url: str,
    headers: dict[str, str] | None = None,
    body: object = None,
    timeout: float = 2.0,
    path: str = "/t",
) -> Answered | httpx.Response:
    client = LeanClient(LeanTransport())
    try:
        return await client.request(
            "POST",
            url + path,
            headers=headers or {},
            json={"a": 1} if body is None else body,
            timeout=httpx.Timeout(timeout),
        )
    finally:
        await client.aclose()


def test_requests_share_one_keep_alive_connection() -> None:
    async def go() -> None:
        async with Server(ok(), ok(), ok()) as server:
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                for _ in range(3):
                    response = await client.post(server.url + "/t", json={"a": 1})
                    assert (response.status_code, response.json()) == (201, {"id": "T-1"})
            assert server.connections == 1
            assert server.requests[0].startswith(b"POST /t HTTP/1.1\r\n")
            assert server.requests[0].endswith(b'{"a":1}')

    asyncio.run(go())


def test_chunked_and_gzip_bodies_are_decoded() -> None:
    packed = gzip.compress(b'{"id":"T-2"}')
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"id"\r\n7\r\n:"T-2"}\r\n0\r\n\r\n'
    )

    async def go() -> None:
        async with Server(raw(chunked), ok(packed, b"Content-Encoding: gzip\r\n")) as server:
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                first = await client.post(server.url + "/t", json={})
                second = await client.post(server.url + "/t", json={})
            assert first.json() == {"id": "T-2"}
            assert second.json() == {"id": "T-2"}

    asyncio.run(go())


def test_connection_close_is_honoured_and_a_closed_idle_connection_is_not_reused() -> None:
    async def go() -> None:
        closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
        async with Server(raw(closing, keep_open=False), ok(), ok()) as server:
            transport = LeanTransport()
            async with httpx.AsyncClient(transport=transport) as client:
                assert (await client.post(server.url + "/t", json={})).json() == {}
                assert (await client.post(server.url + "/t", json={})).status_code == 201
            assert server.connections == 2

    asyncio.run(go())


def test_a_server_closing_an_idle_connection_costs_nothing() -> None:
    async def go() -> None:
        # Keep-alive framing, then the server hangs up while the connection sits idle.
        hang_up = raw(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", keep_open=False)
        async with Server(hang_up, ok()) as server:
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                await client.post(server.url + "/t", json={})
                await server.hung_up.wait()
                second = await client.post(server.url + "/t", json={})
            assert second.status_code == 201
            assert server.connections == 2

    asyncio.run(go())


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            raw(b"HTTP/1.1 201 Created\r\nContent-Length: 50\r\n\r\n{", keep_open=False),
            httpx.RemoteProtocolError,
        ),
        (raw(b"", keep_open=False), httpx.RemoteProtocolError),
        (raw(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", delay=1.0), httpx.ReadTimeout),
        (raw(b"NOT HTTP AT ALL\r\n\r\n", keep_open=False), httpx.RemoteProtocolError),
    ],
)
@pytest.mark.parametrize("through", ["httpx client", "lean client"])
def test_a_sent_request_without_a_whole_answer_raises_what_proves_it(
    answer: Answer, error: type[Exception], through: str
) -> None:
    async def go() -> None:
        async with Server(answer) as server:
            attempt = lean_post if through == "lean client" else partial(post, LeanTransport())
            with pytest.raises(error):
                await attempt(server.url, timeout=0.2)

    asyncio.run(go())


def test_nothing_listening_is_a_connect_error() -> None:
    async def go() -> None:
        async with Server() as server:
            url = server.url
        with pytest.raises(httpx.ConnectError):
            await post(LeanTransport(), url)

    asyncio.run(go())


def test_a_closed_transport_refuses_new_requests() -> None:
    async def go() -> None:
        transport = LeanTransport()
        await transport.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await post(transport, "http://127.0.0.1:9")

    asyncio.run(go())


def _headers(request: bytes) -> list[tuple[str, str]]:
    head = request.split(b"\r\n\r\n")[0].decode()
    pairs = [line.split(":", 1) for line in head.split("\r\n")[1:]]
    return [(name.strip().lower(), value.strip()) for name, value in pairs]


def test_the_lean_client_sends_the_callers_headers_over_its_own_defaults() -> None:
    packed = gzip.compress(b'{"id":"T-3"}')

    async def go() -> None:
        async with Server(ok(), ok(packed, b"Content-Encoding: gzip\r\n")) as server:
            first = await lean_post(server.url, {"Idempotency-Key": "k1"})
            second = await lean_post(
                server.url,
                {"user-agent": "tickets-bridge/2", "Idempotency-Key": "k2"},
                {"a": 2, "text": "größe"},
            )
            assert isinstance(first, Answered)
            assert (first.status_code, json.loads(first.content)) == (201, {"id": "T-1"})
            assert first.headers["content-type"] == "application/json"
            # A content-encoded answer is decoded as httpx's client would decode it.
            assert isinstance(second, httpx.Response)
            assert second.json() == {"id": "T-3"}
            sent = [_headers(request) for request in server.requests]
            assert ("user-agent", f"ledgerloop/{__version__}") in sent[0]
            assert ("idempotency-key", "k1") in sent[0]
            assert ("content-type", "application/json") in sent[0]
            assert ("accept", "*/*") in sent[0]
            assert ("host", server.url.removeprefix("http://")) in sent[0]
            # A caller's own User-Agent replaces the default, whatever its case: one header.
            agents = [value for name, value in sent[1] if name == "user-agent"]
            assert agents == ["tickets-bridge/2"]
            assert not any(name == "cookie" for request in sent for name, _ in request)
            # The body as httpx's client encodes JSON: compact, UTF-8, not escaped.
            expected = httpx.Request("POST", server.url, json={"a": 2, "text": "größe"})
            assert server.requests[1].endswith(expected.read())
            assert ("content-length", str(len(expected.read()))) in sent[1]

    asyncio.run(go())


def test_the_lean_client_sends_what_an_httpx_request_would() -> None:
    """Header for header (names, values, order) what the relay sent when it built an
    httpx.Request for each delivery, so a destination sees no change."""

    async def go() -> None:
        caller = {"Idempotency-Key": "k1", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        async with Server(ok()) as server:
            await lean_post(server.url, caller, path="/v1/t?x=1")
            merged = httpx.Headers({"User-Agent": LeanClient.USER_AGENT, "Accept": "*/*"})
            merged.update(caller)
            before = httpx.Request("POST", server.url + "/v1/t?x=1", headers=merged, json={"a": 1})
            head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
            assert head[0] == b"POST /v1/t?x=1 HTTP/1.1"
            lines = [line.split(b": ", 1) for line in head[1:]]
            assert sorted((n.lower(), v) for n, v in lines) == sorted(
                (n.lower(), v) for n, v in before.headers.raw
            )
            assert lines[0] == [b"Host", before.headers["host"].encode()]

    asyncio.run(go())


@pytest.mark.parametrize(
    "headers",
    [{"X-Note": "größe"}, {"X-Note": "a\r\nX-Injected: 1"}, {"Bad Name": "v"}],
    ids=["not-ascii", "line-break", "bad-name"],
)
def test_a_header_that_cannot_be_sent_fails_before_anything_is_sent(
    headers: dict[str, str],
) -> None:
    async def go() -> None:
        async with Server(ok()) as server:
            with pytest.raises(httpx.LocalProtocolError):
                await lean_post(server.url, headers)
            assert server.requests == []

    asyncio.run(go())


def test_a_body_that_is_not_json_fails_before_anything_is_sent() -> None:
    async def go() -> None:
        async with Server(ok()) as server:
            with pytest.raises(httpx.LocalProtocolError, match="not JSON"):
                await lean_post(server.url, body={"amount": float("nan")})
            assert server.requests == []

    asyncio.run(go())


def test_a_refusal_and_its_retry_after_reach_the_relays_verdict() -> None:
    busy = raw(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy"
    )

    async def go() -> Delivery:
        async with Server(busy) as server:
            client = LeanClient(LeanTransport())
            try:
                request = DeliveryRequest(path="/t", body={"a": 1})
                return await send(client, server.url, "k1", request)
            finally:
                await client.aclose()

    delivery = asyncio.run(go())
    assert (delivery.verdict, delivery.status_code, delivery.retry_after_s) == (
        Verdict.RETRY,
        503,
        7.0,
    )
