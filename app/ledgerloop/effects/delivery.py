"""One HTTP call to a destination, and what its answer (or its silence) proves.

The classification is the heart of exactly-once: an outcome is `succeeded` only when the
destination said so in a body we could read; `retry` only when nothing can have reached the
destination's commit point; everything in between is `unknown` and goes to the reconciler.

| what happened                                     | verdict   |
| ------------------------------------------------- | --------- |
| 2xx with a JSON body (or 204)                     | succeeded |
| connection refused, connect timeout, pool timeout | retry     |
| 429, 502, 503, 408                                | retry     |
| other 4xx                                         | failed    |
| 500, 504, other 5xx, 3xx                          | unknown   |
| read/write timeout, reset, protocol error         | unknown   |
| 2xx whose body is not JSON                        | unknown   |
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from ledgerloop.effects.messages import DeliveryRequest

#: Status codes that refuse a request before doing anything: the same request may succeed later.
RETRYABLE_STATUS = frozenset({408, 429, 502, 503})
EXCERPT = 200
#: Connect gives up well inside the overall timeout, so a slow connect is told apart (it is
#: retryable: nothing was sent) from a slow answer (unknown: the request may have committed).
MAX_CONNECT_S = 2.0


class Headers(Protocol):
    def get(self, key: str, default: None = None) -> str | None: ...


class Answered(Protocol):
    """What `send` reads of an answer: an `httpx.Response`, or the lean client's
    (effects.transport.Answer)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Headers: ...
    @property
    def content(self) -> bytes: ...


class Requester(Protocol):
    """What `send` calls: an `httpx.AsyncClient`, or the relay's lean client
    (effects.transport.LeanClient)."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        json: Any,
        timeout: httpx.Timeout,
    ) -> Answered: ...

    async def aclose(self) -> None: ...


class Verdict(StrEnum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Delivery:
    verdict: Verdict
    detail: str = ""
    status_code: int | None = None
    result: Any = None
    external_reference: str | None = None
    retry_after_s: float | None = None


def _excerpt(content: bytes) -> str:
    text = content[:EXCERPT].decode("utf-8", "replace")
    return text + ("…" if len(content) > EXCERPT else "")


def _retry_after(headers: Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def reference_of(body: Any) -> str | None:
    """The downstream's id for what it created: `id` of a JSON object, when present."""
    if isinstance(body, dict):
        ref = body.get("id")
        if isinstance(ref, str | int) and not isinstance(ref, bool):
            return str(ref)
    return None


def classify_response(response: Answered, where: str) -> Delivery:
    status = response.status_code
    content = response.content
    if 200 <= status < 300:
        if status == 204 and not content:
            return Delivery(Verdict.SUCCEEDED, status_code=status)
        try:
            body = json.loads(content)
        except ValueError:
            return Delivery(
                Verdict.UNKNOWN,
                f"HTTP {status} from {where} with a body that is not JSON: {_excerpt(content)!r}",
                status,
            )
        return Delivery(
            Verdict.SUCCEEDED,
            status_code=status,
            result=body,
            external_reference=reference_of(body),
        )
    detail = f"HTTP {status} from {where}: {_excerpt(content)}"
    if status in RETRYABLE_STATUS:
        return Delivery(Verdict.RETRY, detail, status, retry_after_s=_retry_after(response.headers))
    if 400 <= status < 500:
        return Delivery(Verdict.FAILED, detail, status)
    # 5xx other than the refusals above: the server may have committed before it failed.
    # 3xx: after a POST a redirect may point at what was created; we cannot tell.
    return Delivery(Verdict.UNKNOWN, detail, status)


def classify_exception(exc: BaseException, where: str) -> Delivery:
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Delivery(Verdict.RETRY, f"{name} to {where} (nothing was sent): {exc}")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.InvalidURL):
        return Delivery(Verdict.FAILED, f"{name} building the request to {where}: {exc}")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return Delivery(
            Verdict.UNKNOWN, f"{name}: no answer from {where} in time after sending: {exc}"
        )
    # Reset, remote protocol error, read or write error: the request may have been received.
    return Delivery(Verdict.UNKNOWN, f"{name} talking to {where} after sending: {exc}")


def _timeout(total_s: float) -> httpx.Timeout:
    return httpx.Timeout(total_s, connect=min(MAX_CONNECT_S, total_s / 2))


def delivery_url(base_url: str, request: DeliveryRequest) -> str:
    return base_url.rstrip("/") + request.path


async def send(
    client: Requester,
    base_url: str,
    key: str,
    request: DeliveryRequest,
    trace_headers: dict[str, str] | None = None,
) -> Delivery:
    """Make the call with the key in the policy's header; never raises for transport trouble.

    ``trace_headers`` (the delivery span's ``traceparent``) go with it."""
    url = delivery_url(base_url, request)
    where = f"{request.method} {url}"
    headers = {**request.headers, **(trace_headers or {}), request.idempotency_header: key}
    try:
        # The overall bound as well as httpx's per-phase ones: a server dribbling a byte at a
        # time would otherwise keep the call (and the effect's lease) alive forever.
        async with asyncio.timeout(request.timeout_s):
            response = await client.request(
                request.method,
                url,
                headers=headers,
                json=request.body,
                timeout=_timeout(request.timeout_s),
            )
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        return classify_exception(exc, where)
    return classify_response(response, where)


class Lookup(StrEnum):
    FOUND = "found"
    ABSENT = "absent"  # the destination says nothing was created with this key
    TRANSIENT = "transient"  # no answer this time; ask again later
    UNEXPECTED = "unexpected"  # an answer we cannot read: a person should look


@dataclass(frozen=True)
class LookupAnswer:
    kind: Lookup
    detail: str
    status_code: int | None = None
    matches: tuple[Any, ...] = ()

    @property
    def references(self) -> list[str]:
        return [ref for ref in map(reference_of, self.matches) if ref is not None]

    def evidence(self) -> dict[str, Any]:
        return {
            "answer": self.kind.value,
            "status_code": self.status_code,
            "detail": self.detail,
            "references": self.references,
        }


def _matches(body: Any) -> list[Any]:
    """What a lookup found: one object with an id, or the objects in a list (at any key)."""
    if reference_of(body) is not None:
        return [body]
    if isinstance(body, dict):
        for value in body.values():
            if isinstance(value, list):
                return [item for item in value if reference_of(item) is not None]
    if isinstance(body, list):
        return [item for item in body if reference_of(item) is not None]
    return []


async def lookup(
    client: httpx.AsyncClient, base_url: str, key: str, request: DeliveryRequest, timeout_s: float
) -> LookupAnswer:
    """Ask the destination what the key created (request.lookup_path must be set)."""
    assert request.lookup_path is not None
    url = base_url.rstrip("/") + request.lookup_path.replace("{key}", quote(key, safe=":"))
    where = f"GET {url}"
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.get(url, timeout=_timeout(timeout_s))
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        return LookupAnswer(Lookup.TRANSIENT, f"{type(exc).__name__} from {where}: {exc}")
    status = response.status_code
    detail = f"HTTP {status} from {where}: {_excerpt(response.content)}"
    if status == 404:
        return LookupAnswer(Lookup.ABSENT, detail, status)
    if status in RETRYABLE_STATUS or status >= 500:
        return LookupAnswer(Lookup.TRANSIENT, detail, status)
    if status != 200:
        return LookupAnswer(Lookup.UNEXPECTED, detail, status)
    try:
        body = json.loads(response.content)
    except ValueError:
        return LookupAnswer(Lookup.UNEXPECTED, f"{detail} (not JSON)", status)
    found = _matches(body)
    if not found:
        # A 200 listing nothing is the destination saying "nothing with this key".
        if _is_empty_listing(body):
            return LookupAnswer(Lookup.ABSENT, detail, status)
        return LookupAnswer(Lookup.UNEXPECTED, f"{detail} (no id in the answer)", status)
    return LookupAnswer(Lookup.FOUND, detail, status, tuple(found))


def _is_empty_listing(body: Any) -> bool:
    if isinstance(body, list):
        return not body
    if isinstance(body, dict):
        lists = [v for v in body.values() if isinstance(v, list)]
        return bool(lists) and all(not v for v in lists)
    return False
