"""The `ledgerloop` commands for runs, approvals, approvers and effects, and `up` serving HTTP.

Commands run in-process through typer's CliRunner (they read LEDGERLOOP_DATABASE_URL like a
shell would give it); `up` runs as a real subprocess, stopped with SIGTERM.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import Result
from typer.testing import CliRunner

from ledgerloop.approvals.principals import principal_authenticate
from ledgerloop.approvals.store import ApprovalStatus, approval_get
from ledgerloop.cli import cli
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_require
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env
from tests.e2e.conftest import MakeToken, bearer, parked_effect, run_awaiting_approval

pytestmark = pytest.mark.e2e

Invoke = Callable[..., Result]


@pytest.fixture
def invoke(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.delenv("LEDGERLOOP_TOKEN", raising=False)
    monkeypatch.setenv("LEDGERLOOP_AGENT_MODULES", "ledgerloop.examples.ops_agent")
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", db_url)
    monkeypatch.setenv("LEDGERLOOP_POLICY_FILE", str(REPO / "tool_policy.yaml"))
    # Wide enough that tables never cut an id or a hash.
    monkeypatch.setenv("COLUMNS", "250")
    runner = CliRunner()

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(cli, list(args), env=env)

    return run


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_approvers_add_prints_a_token_once_and_it_authenticates(invoke: Invoke, conn: Conn) -> None:
    result = invoke("approvers", "add", "ana@example.com", "--role", "approver", "--role", "viewer")
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert result.stdout == token + "\n"  # stdout is the token alone, for scripts
    assert "shown this once" in result.stderr
    principal = principal_authenticate(conn, token)
    assert principal.name == "ana@example.com"
    assert principal.roles == ("approver", "viewer")
    # Stored hashed: the secret part of the token appears nowhere in the table.
    # llt_<id>_<secret>: the secret itself may contain "_" (url-safe base64).
    secret = token.split("_", 2)[2]
    assert len(secret) == 43
    stored = conn.execute("SELECT row_to_json(p)::text AS row FROM ledgerloop.principal p")
    assert all(secret not in row["row"] for row in stored.fetchall())

    bad_role = invoke("approvers", "add", "bob", "--role", "two words")
    assert "roles must be" in one_line_error(bad_role)


def test_runs_start_list_and_show(invoke: Invoke, conn: Conn) -> None:
    started = invoke("runs", "start", "ops", "--message", "db-1 disk full", "--key", "t-1")
    assert started.exit_code == 0, started.output
    run_id = uuid.UUID(started.stdout.strip())
    assert run_require(conn, run_id).input == {"message": "db-1 disk full"}
    again = invoke("runs", "start", "ops", "--message", "db-1 disk full", "--key", "t-1")
    assert uuid.UUID(again.stdout.strip()) == run_id

    waiting = run_awaiting_approval(conn)
    listed = invoke("runs", "list")
    assert listed.exit_code == 0, listed.output
    assert str(run_id) in listed.stdout
    assert re.search(rf"{waiting.run_id}\s.*ops\s.*awaiting_approval", listed.stdout)
    only_waiting = invoke("runs", "list", "--status", "awaiting_approval")
    assert str(run_id) not in only_waiting.stdout

    shown = invoke("runs", "show", str(waiting.run_id))
    assert shown.exit_code == 0, shown.output
    tree = shown.stdout
    assert f"run {waiting.run_id}" in tree
    assert "awaiting_approval  cost $0.0000" in tree  # no model call yet
    for line in ("event    received", "event    planning", "event    awaiting_approval"):
        assert line in tree
    assert "approval write_ticket  [pending]" in tree
    assert f"action_hash: {waiting.action_hash}" in tree
    # Drawn as a tree: the entries hang off the run, their details off the entries.
    assert "├── " in tree
    assert "└── " in tree

    unknown = invoke("runs", "start", "nobody", "--message", "hi")
    assert re.search(r"unknown agent 'nobody'; known agents: .*\bops\b", one_line_error(unknown))
    bad_input = invoke("runs", "start", "ops", "--input", "[1, 2]")
    assert "--input must be a JSON object" in one_line_error(bad_input)
    missing = invoke("runs", "show", str(uuid.uuid4()))
    assert "no run" in one_line_error(missing)


def test_approvals_list_approve_and_reject_with_a_token(
    invoke: Invoke, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn)
    token = make_token("approver", name="ana@example.com")

    listed = invoke("approvals", "list")
    assert listed.exit_code == 0, listed.output
    assert str(approval.id) in listed.stdout
    assert approval.action_hash in listed.stdout

    approved = invoke("approvals", "approve", str(approval.id), "--token", token, "--reason", "ok")
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.startswith(f"approved: approval {approval.id} (write_ticket, action ")
    assert "by ana@example.com" in approved.stdout
    decided = approval_get(conn, approval.id)
    assert decided is not None
    assert decided.status is ApprovalStatus.APPROVED
    assert decided.reason == "ok"

    # The token may also come from the environment.
    again = invoke("approvals", "approve", str(approval.id), env={"LEDGERLOOP_TOKEN": token})
    assert "(already recorded)" in again.stdout
    rejected = invoke("approvals", "reject", str(approval.id), "--token", token)
    assert "was already approved by ana@example.com" in one_line_error(rejected)
    assert "no approvals" in invoke("approvals", "list").stdout


def test_effects_list_and_resolve(invoke: Invoke, conn: Conn, make_token: MakeToken) -> None:
    effect = parked_effect(conn)
    listed = invoke("effects", "list", "--status", "needs_human")
    assert listed.exit_code == 0, listed.output
    assert effect.key in listed.stdout
    assert "needs_human" in listed.stdout
    assert "no effects" in invoke("effects", "list", "--status", "failed").stdout

    approver = make_token("approver")
    refused = invoke("effects", "resolve", effect.key, "--succeeded", "T-1", "--token", approver)
    assert "resolving effects needs one of the roles operator" in one_line_error(refused)
    operator = make_token("operator", name="oncall")
    neither = invoke("effects", "resolve", effect.key, "--token", operator)
    assert "exactly one decision" in one_line_error(neither)

    resolved = invoke("effects", "resolve", effect.key, "--succeeded", "T-1", "--token", operator)
    assert resolved.exit_code == 0, resolved.output
    assert resolved.stdout == f"effect {effect.key}: succeeded (T-1)\n"
    settled = effect_require(conn, effect.key)
    assert settled.status is EffectStatus.SUCCEEDED
    assert settled.resolved_by is not None
    assert settled.resolved_by.startswith("oncall (principal ")


@pytest.mark.parametrize("token", ["", "llt_wrong", "llt_" + "0" * 32 + "_" + "x" * 43])
def test_a_bad_token_is_one_line_and_exit_2(invoke: Invoke, conn: Conn, token: str) -> None:
    approval = run_awaiting_approval(conn)
    args = ("approvals", "approve", str(approval.id), "--token", token)
    line = one_line_error(invoke(*args))
    assert line == (
        "error: Invalid or revoked token. "
        "(present a current token issued by `ledgerloop approvers add`)"
    )
    assert one_line_error(invoke("effects", "resolve", "k", "--retry", "--token", token)) == line


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_up_serves_the_api_until_sigterm(
    db_url: str, conn: Conn, make_token: MakeToken, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model("default:\n  turns:\n    - text: all done\n")
    port = _free_port()
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_HTTP_PORT=str(port),
    )
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", "up", "--no-relay"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            def healthy() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    return http.get("/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(healthy, timeout=60)
            runner = make_token("runner", "viewer")
            started = http.post(
                "/v1/runs",
                json={"agent": "looper", "input": {"message": "hi"}},
                headers=bearer(runner),
            )
            assert started.status_code == 201, started.text
            timeline_url = f"/v1/runs/{started.json()['id']}/timeline"

            def finished() -> dict[str, Any] | None:
                body: dict[str, Any] = http.get(timeline_url, headers=bearer(runner)).json()
                names = [e["name"] for e in body["entries"] if e["kind"] == "step"]
                # The answer's think step commits the run's success inside its body; DBOS
                # checkpoints the step a moment later, and only then does it list it.
                done = body["run"]["status"] == "succeeded" and "think-0" in names
                return body if done else None

            timeline = wait_until(finished, timeout=60)
            assert isinstance(timeline, dict)
            steps = [e["name"] for e in timeline["entries"] if e["kind"] == "step"]
            # The workflow's steps, read through DBOS's client API, merged with the events.
            assert steps[:2] == ["memory-load", "think-0"]
            assert all(
                e["status"] == "completed" for e in timeline["entries"] if e["kind"] == "step"
            )
            assert timeline["entries"][-1]["kind"] in ("event", "step")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"up on http://127.0.0.1:{port}" in log.read_text()


def test_up_with_a_busy_http_port_stops_and_says_why(db_url: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = worker_env(
            db_url, ANTHROPIC_BASE_URL="http://127.0.0.1:9", LEDGERLOOP_HTTP_PORT=str(port)
        )
        log = tmp_path / "up.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ledgerloop.cli", "up", "--no-relay"],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log.read_text()
    assert proc.returncode == 2, output
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in output
    assert "Traceback" not in output


def test_runs_purge_deletes_finished_runs_and_refuses_a_bad_cutoff(
    conn: Conn, invoke: Invoke
) -> None:
    from ledgerloop.runs.states import RunStatus
    from ledgerloop.runs.store import run_create, run_get, run_transition

    run, _ = run_create(conn, agent="ops", input={})
    run_transition(conn, run, RunStatus.CANCELLED, "cancelled", {})
    live, _ = run_create(conn, agent="ops", input={})

    error = one_line_error(invoke("runs", "purge", "--finished-before", "last tuesday"))
    assert "--finished-before" in error
    assert "30d" in error  # names the forms it accepts

    result = invoke("runs", "purge", "--finished-before", "0s")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("purged 1 runs finished before")
    assert run_get(conn, run.id) is None
    assert run_get(conn, live.id) is not None
