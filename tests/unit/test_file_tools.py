"""Path-confined file tools against real files: `..`, absolute paths and symlinks that lead
out of the root are refused with an error naming the path and the root; reads are capped."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.errors import ConfigError
from ledgerloop.tools.errors import NonRetryableToolError
from ledgerloop.tools.files import PathOutsideRoot, file_tools
from ledgerloop.tools.registry import Tool, ToolContext

CTX = ToolContext("run", "call", "tenant", "run:call")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ with logs and a config; a secret beside the root; links in and out."""
    root = tmp_path / "root"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "app.log").write_text("ok\nERROR pool exhausted\nok\n")
    (root / "config.yaml").write_text("pool:\n  max_size: 10\n")
    (tmp_path / "secret.txt").write_text("TOP SECRET\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "more.txt").write_text("ERROR also secret\n")
    os.symlink(tmp_path / "secret.txt", root / "escape")
    os.symlink(tmp_path / "outside", root / "outdir")
    os.symlink(root / "config.yaml", root / "inside-link")
    return root


def _tools(root: Path, **kwargs: Any) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(root, **kwargs)}


def call(tool: Tool, **args: Any) -> Any:
    assert tool.handler is not None
    return asyncio.run(tool.handler(tool.input_model.model_validate(args), CTX))


@pytest.mark.parametrize(
    "path",
    [
        "../secret.txt",
        "logs/../../secret.txt",
        "escape",  # a symlink to a file outside
        "outdir/more.txt",  # a file under a symlinked directory outside
        "outdir/missing.txt",  # missing, but under that directory: still outside
    ],
)
def test_a_path_that_resolves_outside_the_root_is_refused(tree: Path, path: str) -> None:
    with pytest.raises(PathOutsideRoot) as refused:
        call(_tools(tree)["read_file"], path=path)
    message = str(refused.value)
    assert repr(path) in message
    assert str(tree.resolve()) in message
    # The model reads it as a tool error, not a retryable failure.
    assert isinstance(refused.value, NonRetryableToolError)


def test_an_absolute_path_outside_is_refused(tree: Path) -> None:
    with pytest.raises(PathOutsideRoot):
        call(_tools(tree)["read_file"], path=str(tree.parent / "secret.txt"))
    with pytest.raises(PathOutsideRoot):
        call(_tools(tree)["list_dir"], path="/")


def test_reads_inside_the_root_work_links_included(tree: Path) -> None:
    tools = _tools(tree)
    page = call(tools["read_file"], path="logs/app.log")
    assert page["content"] == "ok\nERROR pool exhausted\nok\n"
    assert "next_offset" not in page
    # A symlink that stays inside the root is followed.
    assert call(tools["read_file"], path="inside-link")["content"].startswith("pool:")
    assert call(tools["read_file"], path="logs/../config.yaml")["path"] == "config.yaml"


def test_a_read_is_capped_and_pages_on(tree: Path) -> None:
    (tree / "big.log").write_text("x" * 100)
    tool = _tools(tree, max_bytes=40)["read_file"]
    first = call(tool, path="big.log")
    assert len(first["content"]) == 40
    assert first["next_offset"] == 40
    assert first["size"] == 100
    last = call(tool, path="big.log", offset=80)
    assert len(last["content"]) == 20
    assert "next_offset" not in last


def test_listing_shows_links_as_links_without_following_them(tree: Path) -> None:
    listing = call(_tools(tree)["list_dir"])
    kinds = {e["name"]: e["type"] for e in listing["entries"]}
    assert kinds == {
        "config.yaml": "file",
        "escape": "link",
        "inside-link": "link",
        "logs": "dir",
        "outdir": "link",
    }
    with pytest.raises(PathOutsideRoot):
        call(_tools(tree)["list_dir"], path="outdir")


def test_search_never_reads_through_a_link_that_leads_out(tree: Path) -> None:
    found = call(_tools(tree)["search_files"], text="error")
    assert [(m["path"], m["line"]) for m in found["matches"]] == [("logs/app.log", 2)]
    assert "secret" not in str(found).lower()


def test_missing_files_and_directories_are_tool_errors(tree: Path) -> None:
    tools = _tools(tree)
    with pytest.raises(NonRetryableToolError, match="no such file"):
        call(tools["read_file"], path="logs/none.log")
    with pytest.raises(NonRetryableToolError, match="is a directory"):
        call(tools["read_file"], path="logs")


def test_a_root_that_does_not_exist_is_refused_at_definition(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        file_tools(tmp_path / "nowhere")
