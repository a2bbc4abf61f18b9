"""A small typed client of the Ledgerloop HTTP API, sync (`Client`) and async (`AsyncClient`):
start a run, iterate its events with automatic resume, send a running agent a message,
approve or reject.

Each `Event` says whether it is durable (an `id`, resumable) or live (no id: a step's
start, a read tool's call and result, the model's text as it is written), and gives its
step, attempt and text typed. `TextSoFar` assembles each step's text from the deltas and
starts a step's text over when it runs again under a new attempt.

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
#: Live events (no id): the model's text as written, a step execution's start, a read tool.
TEXT_DELTA = "text.delta"
STEP_STARTED = "step.started"
TOOL_CALLED = "tool.called"
TOOL_RESULT = "tool.result"
#: Durable events beside the run's status moves (`received`, `planning`, `executing`,
#: `approval_requested`, `succeeded`, ...).
STEP_FINISHED = "step.finished"
APPROVAL_DECIDED = "approval.decided"
MESSAGE_RECEIVED = "message.received"

EventType = Literal[
    "run.finished",
    "text.delta",
    "step.started",
    "tool.called",
    "tool.result",
    "step.finished",
    "approval.decided",
    "message.received",
]


@dataclass(frozen=True)
class Event:
    #: The per-run sequence of a durable event; None for one that is not recorded.
    id: int | None
    #: One of EventType, or the name of a status move (`received`, `planning`, ...).
    type: str
    data: dict[str, Any]

    @property
    def durable(self) -> bool:
        """Recorded (resumable from its id); a live event is not sent again on resume."""
        return self.id is not None

    @property
    def payload(self) -> dict[str, Any]:
        """A durable event's recorded payload ({} for a live one)."""
        payload = self.data.get("payload")
        return payload if isinstance(payload, dict) else {}

    @property
    def step(self) -> str | None:
        """The step the event is about: a live event's, a step.finished's, or the step
        that recorded a status move."""
        step = self.data.get("step") or self.payload.get("step")
        return step if isinstance(step, str) else None

    @property
    def attempt(self) -> int | None:
        """A live event's attempt of its step (1, 2, ...: a step cut off and run again
        publishes under the next one)."""
        attempt = self.data.get("attempt")
        return attempt if isinstance(attempt, int) else None

    @property
    def text(self) -> str:
        """A text.delta's text ("" for any other event)."""
        text = self.data.get("text") if self.type == TEXT_DELTA else None
        return text if isinstance(text, str) else ""


class TextSoFar:
    """Each step's text from the deltas, the partial text of an earlier attempt dropped."""

    def __init__(self) -> None:
        self._texts: dict[str, tuple[int, str]] = {}

    def add(self, event: Event) -> bool:
        """Take a text.delta (other events are ignored). True when it starts the step's text
        over: the step runs again and the text shown so far is void."""
        step, attempt = event.step, event.attempt
        if event.type != TEXT_DELTA or step is None or attempt is None:
            return False
        known, text = self._texts.get(step, (attempt, ""))
        if attempt < known:
            return False  # a late delta of an attempt already superseded
        restarted = attempt > known and text != ""
        self._texts[step] = (attempt, ("" if attempt > known else text) + event.text)
        return restarted

    def text(self, step: str) -> str:
        return self._texts.get(step, (0, ""))[1]


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
