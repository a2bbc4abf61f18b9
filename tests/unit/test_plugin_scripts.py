"""The pytest plugin's `script=`: a file (a Path, or a file name relative to the test file's
directory), YAML text or a dict; anything else is refused with one error saying what would do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledgerloop.models.script import Script, ScriptError
from ledgerloop.testing.pytest_plugin import load_test_script

YAML = """\
default:
  turns:
    - tool_use: {name: find_order, input: {order: A-1}}
    - text: "done"
"""


def _first_tool(script: Script) -> str:
    return script.default.turns[0].tool_use[0].name


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test file's directory, holding conversation.yaml; the cwd is somewhere else, so a
    name resolved against the cwd would not be found."""
    test_dir = tmp_path / "project" / "tests"
    test_dir.mkdir(parents=True)
    (test_dir / "conversation.yaml").write_text(YAML)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return test_dir


def test_a_file_name_is_read_from_the_test_files_directory(here: Path) -> None:
    script = load_test_script("conversation.yaml", here)
    assert _first_tool(script) == "find_order"
    assert script.default.turns[1].text == "done"


def test_a_relative_path_and_an_absolute_one_are_files_too(here: Path) -> None:
    assert _first_tool(load_test_script(Path("conversation.yaml"), here)) == "find_order"
    absolute = here / "conversation.yaml"
    assert _first_tool(load_test_script(absolute, Path("/nonexistent"))) == "find_order"


@pytest.mark.parametrize("name", ["conv.yml", "conv.json", "CONV.YAML"])
def test_every_script_suffix_names_a_file(here: Path, name: str) -> None:
    data = {"default": {"turns": [{"text": f"from {name}"}]}}
    (here / name).write_text(json.dumps(data))
    assert load_test_script(name, here).default.turns[0].text == f"from {name}"


def test_yaml_text_and_a_dict_are_scripts_themselves(here: Path) -> None:
    assert _first_tool(load_test_script(YAML, here)) == "find_order"
    one_line = load_test_script("default: {turns: [{text: hi}]}", here)
    assert one_line.default.turns[0].text == "hi"
    as_dict = load_test_script({"default": {"turns": [{"text": "hi"}]}}, here)
    assert as_dict.default.turns[0].text == "hi"


def test_a_missing_file_says_where_it_looked_and_what_else_would_do(here: Path) -> None:
    with pytest.raises(pytest.UsageError) as caught:
        load_test_script("refund_conversation.yaml", here)
    message = str(caught.value)
    assert str(here / "refund_conversation.yaml") in message
    assert "test file's directory" in message
    assert "absolute Path" in message


def test_a_missing_path_is_refused_the_same_way(here: Path) -> None:
    with pytest.raises(pytest.UsageError, match="names no file"):
        load_test_script(Path("nope.yml"), here)


def test_a_name_without_a_script_suffix_is_refused_naming_the_fix(here: Path) -> None:
    # Read as YAML it is a bare string, not a script; the old error ("the top level must be a
    # mapping") did not say that a file name needs its suffix.
    with pytest.raises(pytest.UsageError) as caught:
        load_test_script("conversation", here)
    message = str(caught.value)
    assert "'conversation' is neither a script file nor a script" in message
    assert ".yaml, .yml, .json" in message


def test_yaml_text_with_a_mistake_keeps_the_scripts_own_error(here: Path) -> None:
    with pytest.raises(ScriptError) as caught:
        load_test_script("default:\n  turns:\n    - txt: hi\n", here)
    assert "default.turns[0]" in str(caught.value)


def test_a_broken_script_file_names_the_file(here: Path) -> None:
    (here / "broken.yaml").write_text("default:\n  turns: [{text: hi, empty: true}]\n")
    with pytest.raises(ScriptError) as caught:
        load_test_script("broken.yaml", here)
    assert str(here / "broken.yaml") in str(caught.value)
