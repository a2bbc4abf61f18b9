"""A small typed client of the Ledgerloop HTTP API, sync (`Client`) and async (`AsyncClient`):
start a run, iterate its events with automatic resume, send a running agent a message,
approve or reject.

`events()` follows GET /v1/runs/{id}/events (docs/streaming.md) and reconnects by itself
when the connection drops, sending `Last-Event-ID` so no durable event is seen twice or
missed; it ends after `run.finished`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx

#: The stream's last event (docs/streaming.md).
FINISHED = "run.finished"


@dataclass(frozen=True)
class Event:
    #: The per-run sequence of a durable event; None for one that is not recorded.
    id: int | None
    type: str
    data: dict[str, Any]


class ApiError(Exception):
    """The API answered with an error: its status, type, message and fix."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.type: str = error.get("type", "http_error")
        self.fix: str | None = error.get("fix")
        message = error.get("message", f"HTTP {status}")
        super().__init__(
            f"{status} {self.type}: {message}" + (f" ({self.fix})" if self.fix else "")
        )


class SseParser:
    """Server-Sent Events framing, line by line (comments skipped)."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> Event | None:
        if line == "":
            fields, self._fields = self._fields, {}
            if "event" not in fields:
                return None
            ident = int(fields["id"]) if fields.get("id") else None
            return Event(ident, fields["event"], json.loads(fields.get("data") or "{}"))
        if not line.startswith(":"):
            name, _, value = line.partition(":")
            self._fields[name] = value.removeprefix(" ")
        return None


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    parser = SseParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


def _checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        raise ApiError(response.status_code, body)
    result: dict[str, Any] = response.json()
    return result


def _start_request(
    agent: str, input: dict[str, Any], idempotency_key: str | None
) -> tuple[dict[str, Any], dict[str, str]]:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return {"agent": agent, "input": input}, headers


def _message_request(
    run_id: str, content: str, idempotency_key: str | None
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A message needs a key: a retry with the same key is the same message, never a second
    one. Without one, a fresh key (so the call itself is safe, a retry of it is not)."""
    key = idempotency_key or str(uuid.uuid4())
    return f"/v1/runs/{run_id}/messages", {"content": content}, {"Idempotency-Key": key}


def _resume_headers(last: int | None) -> dict[str, str]:
    return {} if last is None else {"Last-Event-ID": str(last)}


class Client:
    """`with Client("http://127.0.0.1:8080", token) as api: ...`"""

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 30, retry_s: float = 0.5
    ) -> None:
        self.retry_s = retry_s
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, read=None),
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def start_run(
        self, agent: str, input: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        body, headers = _start_request(agent, input, idempotency_key)
        return _checked(self._http.post("/v1/runs", json=body, headers=headers))

    def run(self, run_id: str) -> dict[str, Any]:
        return _checked(self._http.get(f"/v1/runs/{run_id}"))

    def decide(
        self,
        approval_id: str,
        decision: Literal["approve", "reject"] = "approve",
        reason: str | None = None,
    ) -> dict[str, Any]:
        body = {"decision": decision, "reason": reason}
        return _checked(self._http.post(f"/v1/approvals/{approval_id}/decision", json=body))

    def send_message(
        self, run_id: str, content: str, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Tell a running agent something (202: durable; the agent reads it at its next turn
        boundary, or in wait_for_message). Pass an `idempotency_key` to retry safely."""
        path, body, headers = _message_request(run_id, content, idempotency_key)
        return _checked(self._http.post(path, json=body, headers=headers))

    def approve(self, approval_id: str, reason: str | None = None) -> dict[str, Any]:
        return self.decide(approval_id, "approve", reason)

    def events(self, run_id: str, *, after: int | None = None) -> Iterator[Event]:
        """The run's events from after `after` (the start by default) until run.finished,
        reconnecting from the last id seen whenever the connection drops."""
        last = after
        while True:
            try:
                with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=_resume_headers(last)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _checked(response)
                    for event in parse_sse(response.iter_lines()):
                        if event.id is not None:
                            last = event.id
                        yield event
                        if event.type == FINISHED:
                            return
            except httpx.TransportError:
                pass
            time.sleep(self.retry_s)  # dropped, or closed before the end: resume


class AsyncClient:
    """`async with AsyncClient("http://127.0.0.1:8080", token) as api: ...`"""

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 30, retry_s: float = 0.5
    ) -> None:
        self.retry_s = retry_s
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, read=None),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def start_run(
        self, agent: str, input: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        body, headers = _start_request(agent, input, idempotency_key)
        return _checked(await self._http.post("/v1/runs", json=body, headers=headers))

    async def run(self, run_id: str) -> dict[str, Any]:
        return _checked(await self._http.get(f"/v1/runs/{run_id}"))

    async def decide(
        self,
        approval_id: str,
        decision: Literal["approve", "reject"] = "approve",
        reason: str | None = None,
    ) -> dict[str, Any]:
        body = {"decision": decision, "reason": reason}
        return _checked(await self._http.post(f"/v1/approvals/{approval_id}/decision", json=body))

    async def send_message(
        self, run_id: str, content: str, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """As Client.send_message, asynchronously."""
        path, body, headers = _message_request(run_id, content, idempotency_key)
        return _checked(await self._http.post(path, json=body, headers=headers))

    async def approve(self, approval_id: str, reason: str | None = None) -> dict[str, Any]:
        return await self.decide(approval_id, "approve", reason)

    async def events(self, run_id: str, *, after: int | None = None) -> AsyncIterator[Event]:
        """As Client.events, asynchronously."""
        last = after
        while True:
            try:
                async with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=_resume_headers(last)
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _checked(response)
                    parser = SseParser()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        if event.id is not None:
                            last = event.id
                        yield event
                        if event.type == FINISHED:
                            return
            except httpx.TransportError:
                pass
            await asyncio.sleep(self.retry_s)
