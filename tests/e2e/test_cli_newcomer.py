"""What a newcomer hit with the `ledgerloop` command: data read as rich markup, ids cut at 80
columns, no --json, `runs stuck` reporting its own exit as an error, approvers that could not
be listed or revoked, agent modules in the current directory not found, and an agent module
whose import failed without being named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from ledgerloop.cli import cli
from ledgerloop.db.connect import Conn
from ledgerloop.testing.processes import REPO
from tests.e2e.conftest import MakeToken, bearer, parked_effect, run_awaiting_approval

pytestmark = pytest.mark.e2e

Invoke = Callable[..., Result]
MARKUP = "[/bold] disk"  # a closing tag with nothing open: rich raises on it
TAG = "[high]"  # a tag rich knows nothing of: rich drops it


@pytest.fixture
def invoke(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.delenv("LEDGERLOOP_TOKEN", raising=False)
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", db_url)
    monkeypatch.setenv("LEDGERLOOP_POLICY_FILE", str(REPO / "tool_policy.yaml"))
    monkeypatch.delenv("COLUMNS", raising=False)
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(cli, list(args))

    return run


def _command(
    db_url: str, *args: str, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "PYTHONPATH"))}
    # A console script: sys.path starts at the interpreter's bin directory, not the cwd.
    ledgerloop = Path(sys.executable).parent / "ledgerloop"
    return subprocess.run(
        [str(ledgerloop), *args],
        env={**base, "LEDGERLOOP_DATABASE_URL": db_url, "COLUMNS": "80", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_titles_with_markup_are_printed_as_written(invoke: Invoke, conn: Conn) -> None:
    approval = run_awaiting_approval(conn, arguments={"title": MARKUP, "priority": TAG})
    conn.execute(
        "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, "
        "heartbeat_at) VALUES ('w-1', 'ledgerloop-1', %s, 7, now())",
        (f"{MARKUP} {TAG}",),
    )
    listed = invoke("approvals", "list")
    assert listed.exit_code == 0, listed.output
    assert f"Open ticket {MARKUP}" in listed.stdout
    assert str(approval.id) in listed.stdout
    workers = invoke("workers")
    assert workers.exit_code == 0, workers.output
    assert f"{MARKUP} {TAG}" in workers.stdout


def test_list_commands_print_one_json_document(
    invoke: Invoke, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn, arguments={"title": MARKUP, "priority": TAG})
    effect = parked_effect(conn)
    make_token("approver", name=f"ana {TAG}")
    runs = json.loads(invoke("runs", "list", "--json").stdout)
    assert {r["id"] for r in runs} == {str(approval.run_id), str(effect.run_id)}
    assert {r["status"] for r in runs} == {"awaiting_approval", "received"}
    (found,) = json.loads(invoke("approvals", "list", "--json").stdout)
    assert found["id"] == str(approval.id)
    assert found["summary"] == f"Open ticket {MARKUP}"
    assert found["action_hash"] == approval.action_hash
    (parked,) = json.loads(invoke("effects", "list", "--json").stdout)
    assert (parked["key"], parked["status"]) == (effect.key, "needs_human")
    (approver,) = json.loads(invoke("approvers", "list", "--json").stdout)
    assert (approver["name"], approver["roles"]) == (f"ana {TAG}", ["approver"])
    assert "token" not in json.dumps(approver)
    assert json.loads(invoke("workers", "--json").stdout) == []
    assert json.loads(invoke("runs", "stuck", "--json").stdout) == []


def test_runs_stuck_exits_1_without_calling_it_an_error(invoke: Invoke, conn: Conn) -> None:
    approval = run_awaiting_approval(conn)
    conn.execute(  # PENDING under a worker that is gone
        "UPDATE dbos.workflow_status SET status = 'PENDING', executor_id = 'gone' "
        "WHERE workflow_uuid = %s",
        (str(approval.run_id),),
    )
    result = invoke("runs", "stuck")
    assert result.exit_code == 1, result.output
    assert str(approval.run_id) in result.stdout
    assert "error" not in result.output
    as_json = invoke("runs", "stuck", "--json")
    assert as_json.exit_code == 1
    (stuck,) = json.loads(as_json.stdout)
    assert stuck["run_id"] == str(approval.run_id)


def test_ids_are_never_cut_in_a_pipe_at_80_columns(db_url: str, conn: Conn) -> None:
    approval = run_awaiting_approval(conn)
    for args, whole in (
        (["runs", "list"], str(approval.run_id)),
        (["approvals", "list"], str(approval.id)),
        (["approvals", "list"], approval.action_hash),
    ):
        result = _command(db_url, *args)
        assert result.returncode == 0, result.stderr
        assert whole in result.stdout, result.stdout


def test_approvers_list_and_revoke_and_the_api_refuses_the_token(
    invoke: Invoke, conn: Conn, make_token: MakeToken, http: httpx.Client
) -> None:
    token = make_token("viewer", name="carol@example.com")
    make_token("viewer", name="dave@example.com")
    assert http.get("/v1/runs", headers=bearer(token)).status_code == 200
    listed = invoke("approvers", "list")
    assert listed.exit_code == 0, listed.output
    assert "carol@example.com" in listed.stdout
    assert "dave@example.com" in listed.stdout

    revoked = invoke("approvers", "revoke", "carol@example.com")
    assert revoked.exit_code == 0, revoked.output
    assert "revoked approver" in revoked.stdout
    assert http.get("/v1/runs", headers=bearer(token)).status_code == 401
    assert "carol@example.com" not in invoke("approvers", "list").stdout
    assert "carol@example.com" in invoke("approvers", "list", "--revoked").stdout
    again = invoke("approvers", "revoke", "carol@example.com")
    assert "already revoked" in again.stdout

    (dave,) = [p for p in json.loads(invoke("approvers", "list", "--json").stdout)]
    assert invoke("approvers", "revoke", dave["id"]).exit_code == 0
    unknown = invoke("approvers", "revoke", str(uuid.uuid4()))
    assert unknown.exit_code == 2
    assert "no approver" in unknown.stderr


def test_an_agent_module_in_the_current_directory_imports_and_a_broken_one_is_named(
    db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "my_agents.py").write_text(
        "from ledgerloop import Agent, register_agent\n"
        "register_agent(Agent(name='mine', system='hi', tools=()))\n"
    )
    (tmp_path / "broken_agents.py").write_text("import json\nSETTINGS = json.loads('{')\n")
    started = _command(
        db_url,
        "runs",
        "start",
        "mine",
        "-m",
        "hi",
        cwd=tmp_path,
        LEDGERLOOP_AGENT_MODULES="my_agents",
    )
    assert started.returncode == 0, started.stderr
    uuid.UUID(started.stdout.strip())

    broken = _command(
        db_url,
        "runs",
        "start",
        "mine",
        "-m",
        "hi",
        cwd=tmp_path,
        LEDGERLOOP_AGENT_MODULES="my_agents,broken_agents",
    )
    assert broken.returncode == 2, broken.stdout + broken.stderr
    (line,) = broken.stderr.splitlines()
    assert "importing agent module 'broken_agents' raised JSONDecodeError" in line
    assert "Traceback" not in broken.stderr


def test_ids_are_never_cut_in_an_80_column_terminal(db_url: str, conn: Conn) -> None:
    import pty
    import re

    approval = run_awaiting_approval(conn)
    primary, secondary = pty.openpty()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "PYTHONPATH"))}
    try:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ledgerloop"), "approvals", "list"],
            env={**base, "LEDGERLOOP_DATABASE_URL": db_url, "COLUMNS": "80", "TERM": "xterm"},
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=secondary,
        )
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed: the command has ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(primary)
    screen = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", b"".join(chunks).decode())
    assert str(approval.id) in screen, screen
    assert approval.action_hash in screen, screen
