"""A lean HTTP/1.1 transport under the relay's httpx client.

Why: httpx's default transport (httpcore over anyio) costs about 1 ms of CPU per request on
the reference machine, and more as the pool grows (it scans every connection per request).
That alone caps a relay near 600 deliveries/s. This transport keeps httpx's client, request,
response, timeout and exception types, so the relay's classification is unchanged, and speaks
HTTP/1.1 with h11 (the same parser httpcore uses) over asyncio streams: about 0.1 ms per
request, one write per request, keep-alive connections reused last-in first-out.

What it does not do: proxies, HTTP/2, streaming bodies (responses are read whole, up to
`max_body`). Set `RelayConfig(transport="httpx")` where those matter.

`LeanClient` puts the relay's requests straight on this transport. An `httpx.AsyncClient`
around it would run, per request, its auth flow, redirect and event-hook wrappers and its
cookie jar, none of which the relay uses (it follows no redirect, keeps no cookie, carries
no credentials of its own): about 0.2 ms of a write turn on the reference machine. Nor does
it build httpx's request, URL, headers and response objects per call (`exchange`): the
relay reads a status, two headers and a body, and those objects were about a quarter of a
delivery's CPU. An answer whose body is content-encoded still comes back as an
`httpx.Response`, decoded the way httpx's client decodes it.

Errors map to httpx's classes by what they prove: nothing sent (ConnectError, ConnectTimeout,
PoolTimeout) versus sent and unanswered (WriteError, ReadTimeout, ReadError,
RemoteProtocolError).
"""

from __future__ import annotations

import asyncio
import contextlib
import json as _json
import select
import socket
import ssl
import time
from dataclasses import dataclass, field
from functools import lru_cache
from types import TracebackType
from typing import ClassVar

import h11
import httpx

from ledgerloop.version import __version__

Origin = tuple[str, str, int]


@dataclass(frozen=True)
class Answer:
    """A whole answer as the relay reads it: the status, the headers (names in lower case;
    a repeated header keeps its last value) and the body."""

    status_code: int
    headers: dict[str, str]
    content: bytes


@dataclass(frozen=True)
class _Target:
    origin: Origin
    #: The request target (path and query), as httpx encodes it.
    path: bytes
    #: The Host header's value.
    host: bytes


@lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    """Where `url` goes, parsed (and encoded) by httpx once per URL, not once per request."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url!r}")
    return _Target(_origin(parsed), parsed.raw_path, parsed.netloc)


def _response(head: h11.Response, content: bytes, request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        head.status_code,
        headers=list(head.headers),
        stream=httpx.ByteStream(content),
        request=request,
        extensions={"http_version": b"HTTP/1.1", "reason_phrase": bytes(head.reason)},
    )


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        # An idle connection the server closed (or wrote to) must not carry a request: it would
        # turn a clean "nothing sent" into an ambiguous "no answer". Ask the socket itself, not
        # only the reader, which learns of the close only when the event loop gets to it.
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and not _readable(self.writer.get_extra_info("socket"))
        )

    def close(self) -> None:
        self.writer.close()


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        max_connections: int = 100,
        keepalive_expiry: float = 2.0,
        max_body: int = 16 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._expiry = keepalive_expiry
        self._max_body = max_body
        self._ssl = ssl_context
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # httpx's client attaches the request to the exceptions raised here.
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head, content = await self._send(
            _origin(request.url),
            request.method.encode("ascii"),
            request.url.raw_path,
            request.headers.raw,
            body,
            timeouts.get("pool"),
            timeouts.get("connect"),
            timeouts.get("write"),
            timeouts.get("read"),
        )
        return _response(head, content, request)

    async def exchange(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeout: httpx.Timeout,
    ) -> Answer | httpx.Response:
        """`method url` with `headers` (Host included) and `body`, answered whole; raises
        httpx's exceptions as `handle_async_request` does (with no request attached). A
        content-encoded answer comes back as an `httpx.Response` with its body decoded."""
        target = _target(url)
        head, content = await self._send(
            target.origin,
            method.encode("ascii"),
            target.path,
            headers,
            body,
            timeout.pool,
            timeout.connect,
            timeout.write,
            timeout.read,
        )
        named = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
        if named.get("content-encoding", "identity").lower() != "identity":
            response = _response(head, content, httpx.Request(method, url))
            await response.aread()  # decodes it, or raises httpx.DecodingError
            return response
        return Answer(head.status_code, named, content)

    async def _send(
        self,
        origin: Origin,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        pool: float | None,
        connect: float | None,
        write: float | None,
        read: float | None,
    ) -> tuple[h11.Response, bytes]:
        if self._closed:
            raise RuntimeError("the transport is closed")
        if self._slots.locked():  # only a full transport waits (and only then needs a timer)
            try:
                async with asyncio.timeout(pool):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise httpx.PoolTimeout("no connection slot free in time") from exc
        else:
            await self._slots.acquire()
        try:
            conn = self._take_idle(origin)
            if conn is None:
                conn = await self._connect(origin, connect)
            try:
                answered = await self._exchange(conn, method, target, headers, body, write, read)
            except BaseException:
                conn.close()
                raise
            self._release(origin, conn)
            return answered
        finally:
            self._slots.release()

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable(now, self._expiry):
                return conn
            conn.close()
        return None

    def _release(self, origin: Origin, conn: _Connection) -> None:
        protocol = conn.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            conn.idle_since = time.monotonic()
            self._idle.setdefault(origin, []).append(conn)
        else:
            conn.close()  # the server asked to close, or the exchange ended early

    async def _connect(self, origin: Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            context = self._ssl or httpx.create_ssl_context()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host if context else None
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(reader, writer)

    async def _exchange(
        self,
        conn: _Connection,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        write: float | None,
        read: float | None,
    ) -> tuple[h11.Response, bytes]:
        protocol = conn.protocol
        try:
            data = protocol.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data = (data or b"") + (protocol.send(h11.Data(data=body)) or b"")
            data = (data or b"") + (protocol.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        try:
            conn.writer.write(data)
            if conn.writer.transport.get_write_buffer_size():  # the socket took only part
                async with asyncio.timeout(write):
                    await conn.writer.drain()
            else:
                await conn.writer.drain()  # no wait: raises only if the connection is lost
        except TimeoutError as exc:
            raise httpx.WriteTimeout("writing the request timed out") from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        return await self._read_response(conn, read)

    async def _read_response(
        self, conn: _Connection, timeout: float | None
    ) -> tuple[h11.Response, bytes]:
        protocol = conn.protocol
        head: h11.Response | None = None
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                try:
                    async with asyncio.timeout(timeout):
                        chunk = await conn.reader.read(65536)
                except TimeoutError as exc:
                    raise httpx.ReadTimeout("no answer in time") from exc
                except OSError as exc:
                    raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                protocol.receive_data(chunk)  # b"" is the server closing its side
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self._max_body:
                    raise httpx.RemoteProtocolError(
                        f"response body larger than {self._max_body} bytes"
                    )
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "server closed the connection without a complete response"
                )
            # InformationalResponse (1xx): keep reading for the final response.
        assert head is not None
        return head, b"".join(chunks)

    async def aclose(self) -> None:
        self._closed = True
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()


class LeanClient:
    """The relay's client on a `LeanTransport`: `request` builds the request and sends it,
    nothing else. What it sends: the caller's headers (over its own defaults, by name in any
    case), `Host`, the body's `Content-Type` and `Content-Length` (unless the caller gave
    them), and by default `User-Agent: ledgerloop/<version>` and `Accept: */*`; never a
    cookie. The body is JSON as httpx's client encodes it."""

    USER_AGENT = f"ledgerloop/{__version__}"
    _DEFAULTS: ClassVar[dict[str, tuple[str, str]]] = {
        "user-agent": ("User-Agent", USER_AGENT),
        "accept": ("Accept", "*/*"),
    }

    def __init__(self, transport: LeanTransport) -> None:
        self._transport = transport

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        json: object,
        timeout: httpx.Timeout,
    ) -> Answer | httpx.Response:
        target = _target(url)
        try:
            body = _json.dumps(
                json, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise httpx.LocalProtocolError(f"the body is not JSON: {exc}") from exc
        named = dict(self._DEFAULTS)
        for name, value in headers.items():
            named[name.lower()] = (name, value)  # a caller's `user-agent` replaces the default
        named.setdefault("content-type", ("Content-Type", "application/json"))
        named.setdefault("content-length", ("Content-Length", str(len(body))))
        raw = [] if "host" in named else [(b"Host", target.host)]
        try:
            raw += [(name.encode("ascii"), value.encode("ascii")) for name, value in named.values()]
        except UnicodeEncodeError as exc:
            raise httpx.LocalProtocolError(f"a header that is not ASCII: {exc}") from exc
        return await self._transport.exchange(method.upper(), url, raw, body, timeout)

    async def aclose(self) -> None:
        await self._transport.aclose()


def _readable(sock: socket.socket | None) -> bool:
    """Whether an idle socket has anything to read (a FIN, or bytes nobody asked for)."""
    if sock is None:
        return False
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def _origin(url: httpx.URL) -> Origin:
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.scheme, url.host, port
