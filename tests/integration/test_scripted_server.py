"""The scripted Messages API server, driven through the real anthropic SDK and raw HTTP."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message, MessageParam, TextBlock, ToolUseBlock

from ledgerloop.models.script import OPS_DEMO_SCRIPT, Script, load_script
from ledgerloop.models.scripted_server import EXHAUSTED_TEXT, ScriptedModelServer, main

REPO = Path(__file__).resolve().parents[2]
TOOL_ID = re.compile(r"^toolu_[0-9a-f]{24}$")

SCRIPT: dict[str, Any] = {
    "default": {
        "turns": [
            {"text": "turn 0"},
            {"text": "turn 1"},
            {"text": "turn 2"},
        ]
    },
    "conversations": [
        {
            "match": "use tools",
            "turns": [
                {
                    "text": "looking",
                    "tool_use": [
                        {"name": "search_kb", "input": {"query": "disk"}},
                        {"name": "write_ticket", "input": {"title": "t"}},
                    ],
                }
            ],
        },
        {"match": "say nothing", "turns": [{"empty": True}]},
        {"match": "rate limited", "turns": [{"status": 429, "times": 1, "then": {"text": "ok"}}]},
        {"match": "broken", "turns": [{"status": 500, "times": 5, "then": {"text": "late"}}]},
        {"match": "always", "turns": [{"status": 503, "message": "try later"}]},
        {"match": "slow", "turns": [{"text": "finally", "delay_ms": 5000}]},
        {
            "match": "escalate",
            "name": "tiers",
            "turns": [{"by_model": {"cheap": {"empty": True}, "strong": {"text": "strong"}}}],
        },
    ],
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ScriptedModelServer]:
    log_path = tmp_path / "requests.jsonl"
    with ScriptedModelServer(Script.model_validate(SCRIPT), log_path=log_path) as running:
        yield running


def client(server: ScriptedModelServer, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(api_key="scripted", base_url=server.url, **options)


def conversation(first: str, assistant_turns: int = 0) -> list[MessageParam]:
    """A request's messages: first user message `first`, at turn `assistant_turns`."""
    messages: list[MessageParam] = [{"role": "user", "content": first}]
    for n in range(assistant_turns):
        messages.append({"role": "assistant", "content": f"answer {n}"})
        messages.append({"role": "user", "content": "go on"})
    return messages


def ask(
    server: ScriptedModelServer,
    first: str,
    *,
    assistant_turns: int = 0,
    model: str = "strong",
    **options: Any,
) -> Message:
    with client(server, **options) as sdk:
        messages = conversation(first, assistant_turns)
        return sdk.messages.create(model=model, max_tokens=256, messages=messages)


def post_raw(
    server: ScriptedModelServer, body: object, path: str = "/v1/messages"
) -> httpx.Response:
    return httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=5)


def only_text(message: Message) -> str:
    (block,) = message.content
    assert isinstance(block, TextBlock)
    return block.text


def test_a_text_reply_parses_into_a_message(server: ScriptedModelServer) -> None:
    message = ask(server, "hello", model="claude-test")

    assert only_text(message) == "turn 0"
    assert message.model == "claude-test"
    assert message.role == "assistant"
    assert message.stop_reason == "end_turn"
    assert message.id.startswith("msg_")
    assert message.usage.input_tokens > 0
    assert message.usage.output_tokens > 0


def test_tool_use_blocks_have_deterministic_ids(server: ScriptedModelServer) -> None:
    first = ask(server, "please use tools")
    replayed = ask(server, "please use tools")
    other_input = ask(server, "please use tools on db-2")

    assert first.stop_reason == "tool_use"
    text, *calls = first.content
    assert isinstance(text, TextBlock)
    assert text.text == "looking"
    assert all(isinstance(call, ToolUseBlock) for call in calls)
    tool_calls = [call for call in calls if isinstance(call, ToolUseBlock)]
    assert [(c.name, c.input) for c in tool_calls] == [
        ("search_kb", {"query": "disk"}),
        ("write_ticket", {"title": "t"}),
    ]
    ids = [c.id for c in tool_calls]
    assert all(TOOL_ID.match(i) for i in ids)
    assert len(set(ids)) == 2
    assert [b.id for b in replayed.content if isinstance(b, ToolUseBlock)] == ids
    assert replayed.id == first.id
    other_ids = [b.id for b in other_input.content if isinstance(b, ToolUseBlock)]
    assert not set(other_ids) & set(ids)


def test_an_empty_turn_has_no_content_but_burns_output_tokens(server: ScriptedModelServer) -> None:
    message = ask(server, "say nothing")

    assert message.content == []
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens >= 10_000


def test_a_429_once_then_success_is_retried_by_the_sdk(server: ScriptedModelServer) -> None:
    message = ask(server, "rate limited", max_retries=2)

    assert only_text(message) == "ok"
    assert [r["status"] for r in server.requests()] == [429, 200]
    assert [r["outcome"] for r in server.requests()] == ["error", "message"]


def test_a_429_carries_retry_after_and_an_anthropic_error_body(
    server: ScriptedModelServer,
) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "rate limited"}],
    }

    limited = post_raw(server, body)
    after = post_raw(server, body)

    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "0"
    assert limited.json()["type"] == "error"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert after.status_code == 200


def test_a_500_five_times_raises_without_sdk_retries(server: ScriptedModelServer) -> None:
    with pytest.raises(anthropic.InternalServerError) as caught:
        ask(server, "broken", max_retries=0)

    assert caught.value.status_code == 500
    assert [r["status"] for r in server.requests()] == [500]


def test_errors_are_counted_per_conversation_input(server: ScriptedModelServer) -> None:
    """Two runs with different inputs each get their own scripted failures."""
    for first in ("broken a", "broken b"):
        for _ in range(5):
            with pytest.raises(anthropic.InternalServerError):
                ask(server, first)
    assert only_text(ask(server, "broken a")) == "late"
    assert only_text(ask(server, "broken b")) == "late"


def test_a_status_without_times_fails_every_attempt(server: ScriptedModelServer) -> None:
    for _ in range(3):
        with pytest.raises(anthropic.ServiceUnavailableError, match="try later"):
            ask(server, "always")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, anthropic.RateLimitError),
        (500, anthropic.InternalServerError),
        (503, anthropic.ServiceUnavailableError),
        (529, anthropic.OverloadedError),
    ],
)
def test_each_scripted_status_maps_to_the_sdk_error(
    status: int, error: type[anthropic.APIStatusError]
) -> None:
    script = Script.model_validate({"default": {"turns": [{"status": status}]}})
    with ScriptedModelServer(script) as server, pytest.raises(error):
        ask(server, "hi")


def test_a_slow_reply_times_out_in_the_sdk(server: ScriptedModelServer) -> None:
    started = time.monotonic()

    with pytest.raises(anthropic.APITimeoutError):
        ask(server, "slow", timeout=0.2, max_retries=0)

    assert time.monotonic() - started < 2
    assert server.requests()[0]["conversation"] == "slow"


def test_by_model_scripts_tier_escalation(server: ScriptedModelServer) -> None:
    cheap = ask(server, "escalate please", model="cheap")
    strong = ask(server, "escalate please", model="strong")

    assert cheap.content == []
    assert only_text(strong) == "strong"
    assert cheap.id != strong.id
    with pytest.raises(anthropic.BadRequestError, match="no reply for model"):
        ask(server, "escalate please", model="unlisted")
    assert [(r["model"], r["conversation"]) for r in server.requests()] == [
        ("cheap", "tiers"),
        ("strong", "tiers"),
        ("unlisted", "tiers"),
    ]


def test_the_turn_is_the_number_of_assistant_messages(server: ScriptedModelServer) -> None:
    replies = [only_text(ask(server, "hello", assistant_turns=n)) for n in (2, 0, 1, 3)]

    assert replies == ["turn 2", "turn 0", "turn 1", EXHAUSTED_TEXT]
    assert [r["turn"] for r in server.requests()] == [2, 0, 1, 3]
    assert server.requests()[-1]["outcome"] == "exhausted"


def test_the_conversation_is_matched_in_the_first_user_message(
    server: ScriptedModelServer,
) -> None:
    blocks: list[MessageParam] = [
        {"role": "user", "content": [{"type": "text", "text": "please say nothing at all"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now use tools"},  # not the first user message
    ]
    with client(server) as sdk:
        later = sdk.messages.create(model="m", max_tokens=10, messages=blocks)

    assert only_text(later) == EXHAUSTED_TEXT  # "say nothing" has one turn
    assert ask(server, "nothing to match").content[0].type == "text"
    assert [r["conversation"] for r in server.requests()] == ["say nothing", "default"]


def test_concurrent_runs_each_get_their_own_turns(server: ScriptedModelServer) -> None:
    cases = [(f"run {i}", i % 3) for i in range(24)]

    def send(case: tuple[str, int]) -> str:
        reply = sdk.messages.create(model="m", max_tokens=5, messages=conversation(*case))
        return only_text(reply)

    with client(server) as sdk, ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(send, cases))

    assert replies == [f"turn {turn}" for _, turn in cases]
    assert sorted(r["seq"] for r in server.requests()) == list(range(1, 25))


def test_the_log_file_has_one_json_line_per_request_and_no_api_key(tmp_path: Path) -> None:
    log_path = tmp_path / "model.jsonl"
    script = Script.model_validate(SCRIPT)
    with ScriptedModelServer(script, log_path=log_path) as server:
        with anthropic.Anthropic(
            api_key="sk-very-secret", base_url=server.url, max_retries=2
        ) as sdk:
            sdk.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "rate limited"}]
            )
        post_raw(server, {"messages": []})
        # Readable while the server runs: each line is flushed when written.
        lines = log_path.read_text().splitlines()
        in_memory = server.requests()

    records = [json.loads(line) for line in lines]
    assert records == in_memory
    assert [(r["seq"], r["status"]) for r in records] == [(1, 429), (2, 200), (3, 400)]
    sdk_headers = records[0]["headers"]
    assert sdk_headers["x-api-key"] or sdk_headers["authorization"]
    assert sdk_headers["anthropic-version"]
    assert records[2]["headers"] == {
        "x-api-key": False,
        "authorization": False,
        "anthropic-version": None,
        "traceparent": None,
    }
    assert records[0]["request"]["messages"][0]["content"] == "rate limited"
    assert all(isinstance(r["at"], float) for r in records)
    assert "sk-very-secret" not in log_path.read_text()


@pytest.mark.parametrize("missing", ["model", "messages", "max_tokens"])
def test_a_request_missing_a_field_is_a_400(server: ScriptedModelServer, missing: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    del body[missing]

    response = post_raw(server, body)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert missing in response.json()["error"]["message"]
    assert server.requests()[0]["status"] == 400


def test_a_body_that_is_not_json_is_a_400(server: ScriptedModelServer) -> None:
    response = httpx.post(server.url + "/v1/messages", content=b"{not json", timeout=5)

    assert response.status_code == 400
    assert server.requests()[0]["request"] is None


def test_unknown_paths_are_a_json_404(server: ScriptedModelServer) -> None:
    for response in (httpx.get(server.url + "/v1/models"), post_raw(server, {}, "/v2/messages")):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"
    assert server.requests() == []


def test_requests_endpoint_and_reset(server: ScriptedModelServer) -> None:
    ask(server, "rate limited", max_retries=2)

    listed = httpx.get(server.url + "/_requests").json()
    assert [r["status"] for r in listed] == [429, 200]

    assert httpx.post(server.url + "/_reset").status_code == 200
    assert httpx.get(server.url + "/_requests").json() == []
    # The attempt counter is cleared too: the scripted 429 happens again.
    with pytest.raises(anthropic.RateLimitError):
        ask(server, "rate limited")
    assert server.requests()[0]["seq"] == 3  # seq keeps counting across resets


def test_the_ops_demo_script_runs_search_ticket_answer() -> None:
    messages: list[MessageParam] = [{"role": "user", "content": "db-1 is out of disk"}]
    tools_called = []
    with (
        ScriptedModelServer(load_script(OPS_DEMO_SCRIPT)) as server,
        client(server) as sdk,
    ):
        for _ in range(3):
            reply = sdk.messages.create(model="m", max_tokens=512, messages=messages)
            messages.append({"role": "assistant", "content": reply.content})
            calls = [b for b in reply.content if isinstance(b, ToolUseBlock)]
            tools_called += [c.name for c in calls]
            if not calls:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c.id, "content": "done"}
                        for c in calls
                    ],
                }
            )

    assert tools_called == ["search_kb", "write_ticket"]
    assert reply.stop_reason == "end_turn"
    assert "ticket" in only_text(reply)


def test_stop_is_idempotent_and_url_needs_a_running_server() -> None:
    server = ScriptedModelServer(Script()).start()
    assert server.url == f"http://127.0.0.1:{server.port}"
    server.stop()
    server.stop()
    with pytest.raises(RuntimeError):
        _ = server.url


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    log_path = tmp_path / "log.jsonl"
    command = [
        sys.executable,
        "-m",
        "ledgerloop.models.scripted_server",
        "--script",
        str(OPS_DEMO_SCRIPT),
    ]
    command += ["--port", "0", "--log", str(log_path)]
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.strip().removeprefix("scripted model listening on ")
        try:
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), line
            with anthropic.Anthropic(api_key="x", base_url=url, max_retries=0) as sdk:
                reply = sdk.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "go"}]
                )
            assert isinstance(reply.content[0], ToolUseBlock)
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    assert len(log_path.read_text().splitlines()) == 1


def test_main_reports_a_bad_script_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("default: {turns: [{status: 999}]}")

    assert main(["--script", str(bad)]) == 2

    err = capsys.readouterr().err
    assert str(bad) in err
    assert "default.turns[0].status" in err
    assert len(err.strip().splitlines()) == 1
