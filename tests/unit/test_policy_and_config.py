"""Bad configuration fails at start-up with one clear error naming the problem and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerloop.config import load_settings
from ledgerloop.errors import ConfigError
from ledgerloop.models.client import Tier, make_model_client
from ledgerloop.tools.policy import OnReject, load_policy

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
    assert config["application_version"] == "ledgerloop-1"
    assert first.executor_id != second.executor_id
    assert type(config["serializer"]).__name__ == "DBOSPortableJSONSerializer"


def test_agent_modules_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGERLOOP_AGENT_MODULES", "a.b, c.d")
    assert load_settings().agent_modules == ("a.b", "c.d")
