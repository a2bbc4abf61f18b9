"""Parsing and validation of scripted-model YAML files (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerloop.errors import LedgerloopError
from ledgerloop.models.script import (
    OPS_DEMO_SCRIPT,
    Script,
    ScriptError,
    load_script,
    parse_script,
)


def test_ops_demo_searches_then_files_a_high_priority_ticket_then_answers() -> None:
    turns = load_script(OPS_DEMO_SCRIPT).default.turns

    assert [call.name for turn in turns for call in turn.tool_use] == ["search_kb", "write_ticket"]
    assert turns[0].tool_use[0].input == {"query": "disk full on db-1 runbook"}
    ticket = turns[1].tool_use[0].input
    assert ticket["priority"] == "high"
    assert set(ticket) == {"title", "body", "priority"}
    assert turns[1].text
    assert turns[2].text
    assert not turns[2].tool_use


def test_a_single_tool_use_mapping_is_a_list_of_one() -> None:
    script = parse_script("default: {turns: [{tool_use: {name: search_kb, input: {q: x}}}]}")

    (call,) = script.default.turns[0].tool_use
    assert (call.name, call.input) == ("search_kb", {"q": "x"})


def test_by_model_picks_the_exact_model_then_the_wildcard() -> None:
    script = parse_script(
        """
        default:
          turns:
            - by_model:
                cheap: {empty: true}
                "*": {text: strong answer}
            - by_model:
                cheap: {text: only cheap}
        """
    )
    first, second = script.default.turns

    cheap = first.for_model("cheap")
    strong = first.for_model("strong")
    assert cheap is not None
    assert cheap.empty
    assert strong is not None
    assert strong.text == "strong answer"
    assert second.for_model("strong") is None


def test_the_first_matching_conversation_wins_and_default_is_the_fallback() -> None:
    script = Script.model_validate(
        {
            "default": {"turns": [{"text": "default"}]},
            "conversations": [
                {"match": "refund", "name": "refunds", "turns": [{"text": "r"}]},
                {"match": "refund please", "turns": [{"text": "never reached"}]},
                {"match": "outage", "turns": [{"text": "o"}]},
            ],
        }
    )

    assert script.conversation_for("a refund please")[0] == "refunds"
    assert script.conversation_for("db outage")[0] == "outage"  # label defaults to `match`
    label, conversation = script.conversation_for("hello")
    assert label == "default"
    assert conversation.turns[0].text == "default"


def test_error_reply_with_times_and_then() -> None:
    turn = parse_script(
        "default: {turns: [{status: 429, times: 2, then: {text: ok, delay_ms: 5}}]}"
    ).default.turns[0]

    assert (turn.status, turn.times) == (429, 2)
    assert turn.then is not None
    assert (turn.then.text, turn.then.delay_ms) == ("ok", 5)


def test_an_empty_file_is_an_empty_script() -> None:
    assert parse_script("").default.turns == []


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("default: {turns: [{txet: hi}]}", "default.turns[0].txet", "Extra inputs"),
        ("default: {turns: [{text: [1]}]}", "default.turns[0].text", "valid string"),
        ("default: {turns: [{tool_use: {input: {}}}]}", "default.turns[0].tool_use[0].name", ""),
        ("conversations: [{turns: []}]", "conversations[0].match", "Field required"),
        ("default: {turns: [{status: 418}]}", "default.turns[0].status", "429"),
        ("default: {turns: [{status: 500, times: 0, then: {text: x}}]}", "times", "1"),
        ("default: {turns: [{status: 500, times: 2}]}", "default.turns[0]", "`then`"),
        ("default: {turns: [{text: x, times: 2}]}", "default.turns[0]", "need `status`"),
        ("default: {turns: [{empty: true, text: x}]}", "default.turns[0]", "cannot have"),
        ("default: {turns: [{delay_ms: 5}]}", "default.turns[0]", "a reply needs"),
        (
            "default: {turns: [{status: 500, times: 1, then: {status: 500}}]}",
            "default.turns[0]",
            "not another error",
        ),
        ("default: {turns: [{by_model: {m: {}}}]}", "default.turns[0].by_model.m", "needs"),
        ("default: {turns: [{by_model: {m: {text: x}}, text: y}]}", "default.turns[0]", "mixed"),
    ],
)
def test_a_malformed_script_names_the_file_and_the_field(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)

    with pytest.raises(ScriptError) as caught:
        load_script(path)

    assert caught.value.path == str(path)
    assert caught.value.field is not None
    assert caught.value.field.endswith(field)
    assert str(path) in str(caught.value)
    assert caught.value.field in str(caught.value)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("default: [", "not valid YAML"), ("- a list", "must be a mapping")],
)
def test_a_file_that_is_not_a_yaml_mapping_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)

    with pytest.raises(ScriptError, match=problem) as caught:
        load_script(path)
    assert caught.value.field is None
    assert str(path) in caught.value.one_line()


def test_a_missing_file_is_a_script_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"

    with pytest.raises(ScriptError, match="cannot read") as caught:
        load_script(missing)

    assert str(missing) in str(caught.value)
    # Callers can catch it as the project's error or as a plain ValueError.
    assert isinstance(caught.value, LedgerloopError)
    assert isinstance(caught.value, ValueError)
