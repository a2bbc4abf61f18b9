"""Sandbox fields in tool_policy.yaml: enforced where they apply, refused where they do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerloop.errors import ConfigError
from ledgerloop.examples.analyst import run_code
from ledgerloop.examples.ops_agent import search_kb
from ledgerloop.sandbox import SandboxUnavailable
from ledgerloop.tools.policy import PolicyFile, load_policy
from ledgerloop.worker import check_sandbox_tools


def _policy(tmp_path: Path, text: str) -> PolicyFile:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return load_policy(path)


def test_sandbox_fields_on_a_read_tool_are_refused(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "version: '1'\ntools:\n  search_kb: {sandbox: bwrap}\n")
    with pytest.raises(ConfigError, match="sandbox tools only"):
        check_sandbox_tools(policy, {"search_kb": search_kb})


def test_network_other_than_default_deny_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tools\.run_code\.network"):
        _policy(tmp_path, "version: '1'\ntools:\n  run_code: {network: allow}\n")


def test_unknown_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"limits\.gpus"):
        _policy(tmp_path, "version: '1'\ntools:\n  run_code: {limits: {gpus: 1}}\n")


def test_a_sandbox_tool_defaults_to_gvisor_and_refuses_to_start_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _policy(tmp_path, "version: '1'\n")
    assert policy.for_tool("run_code").sandbox_backend == "gvisor"
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="sandbox backend gvisor cannot run"):
        check_sandbox_tools(policy, {"run_code": run_code})


def test_missing_files_in_is_refused(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        "version: '1'\ntools:\n  run_code: {sandbox: bwrap, files_in: {d.csv: /nonexistent.csv}}\n",
    )
    with pytest.raises(ConfigError, match=r"files_in\.d\.csv"):
        check_sandbox_tools(policy, {"run_code": run_code})
