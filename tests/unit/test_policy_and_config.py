"""Bad configuration fails at start-up with one clear error naming the problem and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from ledgerloop.agent.definition import Agent
from ledgerloop.agent.read_cache import READ_CACHE, READ_CACHE_ENTRIES, ReadCache
from ledgerloop.config import load_settings
from ledgerloop.errors import ConfigError
from ledgerloop.models.client import Tier, make_model_client
from ledgerloop.tools.policy import OnReject, PolicyFile, load_policy
from ledgerloop.tools.registry import HttpEffect, Tool, write_tool
from ledgerloop.worker import check_policy_tools

REPO = Path(__file__).resolve().parents[2]


def test_shipped_policy_file_is_valid() -> None:
    policy = load_policy(REPO / "tool_policy.yaml")
    assert policy.for_tool("write_ticket").requires_approval
    assert policy.for_tool("write_ticket").on_reject is OnReject.CONTINUE
    assert policy.for_tool("search_kb").cache_ttl_s == 120
    assert policy.for_tool("never_mentioned").requires_approval is False


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("version: v1\ntools: {write_ticket: {requires_aproval: true}}", "requires_aproval"),
        ("version: v1\ntools: {write_ticket: {timeout_ms: -5}}", "timeout_ms"),
        ("version: v1\ntools: {write_ticket: {on_reject: shrug}}", "on_reject"),
        ("version: v1\ntools: {run_code: {sandbox: docker}}", "sandbox"),
        ("tools: {}", "version"),
    ],
)
def test_bad_policy_names_the_file_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "tool_policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    message = info.value.one_line()
    assert str(path) in message
    assert field in message


def test_missing_policy_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LEDGERLOOP_POLICY_FILE"):
        load_policy(tmp_path / "nope.yaml")


def test_policy_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_policy(path)


def test_no_model_access_is_one_clear_error() -> None:
    settings = load_settings(anthropic_api_key=None, anthropic_base_url=None)
    with pytest.raises(ConfigError) as info:
        make_model_client(settings)
    assert "ANTHROPIC_API_KEY" in info.value.one_line()
    assert "ANTHROPIC_BASE_URL" in info.value.one_line()


def test_unknown_model_tier_is_refused() -> None:
    client = make_model_client(load_settings(anthropic_base_url="http://127.0.0.1:9"))
    assert client.model_for(Tier.STRONG) == "claude-sonnet-4-6"
    with pytest.raises(ConfigError, match="unknown model tier 'medium'"):
        client.model_for("medium")


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGERLOOP_MAX_ITERATIONS", "zero")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "LEDGERLOOP_MAX_ITERATIONS" in info.value.one_line()


def test_application_version_is_pinned_and_executor_ids_are_unique() -> None:
    first, second = load_settings(), load_settings()
    config = first.dbos_config("postgresql://x@localhost/db")
    assert config["application_version"] == "ledgerloop-2"
    assert first.executor_id != second.executor_id
    assert type(config["serializer"]).__name__ == "DBOSPortableJSONSerializer"


def test_dbos_flushes_its_event_notifications_slowly() -> None:
    # DBOS's default (10 ms) woke a thread 100 times a second on an idle worker: most of
    # its CPU. The key must still be one DBOS's config knows (a rename would drop it).
    from typing import get_type_hints

    from dbos import DBOSConfig

    config = load_settings().dbos_config("postgresql://x@localhost/db")
    assert config["notification_coalesce_sec"] >= 0.1
    assert "notification_coalesce_sec" in get_type_hints(DBOSConfig)


def test_agent_modules_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGERLOOP_AGENT_MODULES", "a.b, c.d")
    assert load_settings().agent_modules == ("a.b", "c.d")


# -- fail closed ------------------------------------------------------------------------------


class _Args(BaseModel):
    text: str


def _write(name: str, destination: str = "tickets") -> Tool:
    effect = HttpEffect(destination=destination, method="POST", path="/notes")
    return write_tool(name, "Write a note.", _Args, effect)(lambda args: {"text": args.text})


def _policy(tmp_path: Path, text: str) -> PolicyFile:
    path = tmp_path / "tool_policy.yaml"
    path.write_text(text)
    return load_policy(path)


def test_a_write_tool_without_policy_refuses_to_start_the_worker(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "version: v1\ntools: {}")
    agent = Agent(name="notes", system="x", tools=(_write("post_note"),))
    with pytest.raises(ConfigError) as info:
        check_policy_tools(policy, registered={"notes": agent})
    message = info.value.one_line()
    assert "post_note (agent notes)" in message
    assert "requires_approval" in message  # the fix: write the rule down
    # Had it run anyway (an agent registered after start-up), it would need an approval.
    assert policy.for_write_tool("post_note").requires_approval is True
    assert policy.for_tool("post_note").requires_approval is False  # read tools: defaults


def test_a_listed_write_tool_starts(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "version: v1\ntools: {post_note: {requires_approval: false}}")
    agent = Agent(name="notes", system="x", tools=(_write("post_note"),))
    check_policy_tools(policy, registered={"notes": agent})
    assert policy.for_write_tool("post_note").requires_approval is False


def test_duplicate_tool_names_in_an_agent_are_refused() -> None:
    with pytest.raises(ConfigError, match="more than one tool named send"):
        Agent(name="twice", system="x", tools=(_write("send"), _write("send", "other")))


def test_the_example_agent_loads_only_when_asked() -> None:
    code = (
        "from ledgerloop.agent.definition import agents, load_agent_modules; "
        "load_agent_modules(()); print(sorted(agents())); "
        "load_agent_modules(['ledgerloop.examples.ops_agent']); print(sorted(agents()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "['ops']"]


def test_the_read_cache_is_keyed_by_tenant_and_agent_and_bounded() -> None:
    cache = ReadCache(max_entries=3)
    mine = cache.key("tenant-a", "ops", "search_kb", {"query": "disk"})
    theirs = cache.key("tenant-b", "ops", "search_kb", {"query": "disk"})
    other_agent = cache.key("tenant-a", "looper", "search_kb", {"query": "disk"})
    cache.put(mine, 60, "a's answer")
    assert cache.get(mine) == "a's answer"
    assert cache.get(theirs) is None
    assert cache.get(other_agent) is None
    for i in range(5):
        cache.put(cache.key("tenant-a", "ops", "search_kb", {"query": i}), 60, i)
    assert len(cache) == 3  # least recently used out first
    assert cache.get(mine) is None
    assert READ_CACHE.max_entries == READ_CACHE_ENTRIES
