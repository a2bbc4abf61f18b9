"""The relay's lean HTTP/1.1 transport against a real socket server that answers byte for byte."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import httpx
import pytest

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
def test_a_sent_request_without_a_whole_answer_raises_what_proves_it(
    answer: Answer, error: type[Exception]
) -> None:
    async def go() -> None:
        async with Server(answer) as server:
            with pytest.raises(error):
                await post(LeanTransport(), server.url, timeout=0.2)

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
            client = LeanClient(LeanTransport())
            try:
                first = await client.request(
                    "POST",
                    server.url + "/t",
                    headers={"Idempotency-Key": "k1"},
                    json={"a": 1},
                    timeout=httpx.Timeout(2.0),
                )
                second = await client.request(
                    "POST",
                    server.url + "/t",
                    headers={"user-agent": "tickets-bridge/2", "Idempotency-Key": "k2"},
                    json={"a": 2},
                    timeout=httpx.Timeout(2.0),
                )
            finally:
                await client.aclose()
            assert (first.status_code, first.json()) == (201, {"id": "T-1"})
            assert second.json() == {"id": "T-3"}  # decoded as httpx's client would
            sent = [_headers(request) for request in server.requests]
            assert ("user-agent", f"ledgerloop/{__version__}") in sent[0]
            assert ("idempotency-key", "k1") in sent[0]
            assert ("content-type", "application/json") in sent[0]
            assert ("accept", "*/*") in sent[0]
            # A caller's own User-Agent replaces the default, whatever its case: one header.
            agents = [value for name, value in sent[1] if name == "user-agent"]
            assert agents == ["tickets-bridge/2"]
            assert not any(name == "cookie" for request in sent for name, _ in request)
            assert server.requests[1].endswith(b'{"a":2}')

    asyncio.run(go())
