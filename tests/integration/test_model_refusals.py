"""Refused model calls are tried again inside the think step; a sent call never is.

Real SDK, real HTTP to the scripted Messages API server, which counts every request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

from ledgerloop.db.cluster import free_port
from ledgerloop.db.connect import Conn
from ledgerloop.models.client import RefusalRetry, refusal_wait
from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.states import RunStatus
from tests.conftest import start_test_run, wait_terminal


def test_a_429_with_retry_after_is_waited_out_and_the_run_succeeds(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        "default: {turns: [{status: 429, times: 1, retry_after_s: 1, then: {text: done}}]}"
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hi"))
    assert run.status is RunStatus.SUCCEEDED
    first, second = model.requests()
    assert (first["status"], second["status"]) == (429, 200)
    # Retry-After said one second: the second request did not come sooner.
    assert second["at"] - first["at"] >= 0.95


def test_overloaded_529s_are_retried_until_the_model_answers(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        "default: {turns: [{status: 529, times: 2, retry_after_s: 0, then: {text: done}}]}"
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hi"))
    assert run.status is RunStatus.SUCCEEDED
    assert [r["status"] for r in model.requests()] == [529, 529, 200]


def test_refusals_are_bounded_then_fail_the_run(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{status: 429, retry_after_s: 0}]}")
    worker(model.url, model_refusal_attempts=3)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hi"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "model_call_failed"
    assert run.state["model_error"]["status_code"] == 429
    assert len(model.requests()) == 3


def test_a_read_timeout_after_sending_fails_the_run_without_a_second_request(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{text: too late, delay_ms: 3000}]}")
    worker(model.url, model_timeout_s=0.5)
    run = wait_terminal(conn, start_test_run(conn, "looper", "hi"))
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "model_call_failed"
    assert run.state["model_error"]["type"] == "APITimeoutError"
    assert len(model.requests()) == 1


def _refused(base_url: str) -> BaseException:
    async def call() -> BaseException:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=base_url, max_retries=0)
        try:
            await client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        except anthropic.APIError as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("the call succeeded")

    return asyncio.run(call())


def test_a_refused_connection_is_a_refusal_and_retry_after_is_capped() -> None:
    policy = RefusalRetry(max_attempts=5, max_wait_s=2.0, first_wait_s=0.5)
    # Nothing listens on the port: the request was never sent.
    refused = _refused(f"http://127.0.0.1:{free_port()}")
    assert isinstance(refused, anthropic.APIConnectionError)
    assert refusal_wait(refused, 1, policy) == 0.5
    assert refusal_wait(refused, 4, policy) == 2.0
    script = parse_script("default: {turns: [{status: 429, retry_after_s: 120}]}")
    with ScriptedModelServer(script) as server:
        limited = _refused(server.url)
    assert isinstance(limited, anthropic.RateLimitError)
    assert refusal_wait(limited, 1, policy) == 2.0  # asked for 120 s, capped


def test_an_answer_error_is_not_a_refusal() -> None:
    script = parse_script("default: {turns: [{status: 500}]}")
    with ScriptedModelServer(script) as server:
        failed = _refused(server.url)
    assert refusal_wait(failed, 1, RefusalRetry()) is None
