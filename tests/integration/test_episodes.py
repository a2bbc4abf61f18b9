"""Typed child episodes end to end: a real worker, DBOS, the scripted model over HTTP.

The budgets (turns per pass, passes, rejected answers per episode) end the episode with a
typed error the parent handles; the investigate example reads its directory, has one answer
rejected and corrected inside the episode, and files exactly one change ticket on approval.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide
from ledgerloop.control.timeline import run_timeline
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from tests.conftest import REPO, wait_terminal

INVESTIGATE_SCRIPT = (REPO / "app/ledgerloop/models/scripts/investigate.yaml").read_text()
#: The test agents too: the tests' policy names their write tools, and a worker checks that.
MODULES = "tests.support.agents,tests.support.episode_agents"
QUESTION = "Checkout answers 503 since 09:14. Why, and what should change?"


def _parent_run(conn: Conn, message: str, **budget: int) -> uuid.UUID:
    return start_run(conn, agent="episode_parent", input={"message": message, "budget": budget})


def _episode_requests(model: ScriptedModelServer) -> list[dict[str, Any]]:
    return [r["request"] for r in model.requests()]


def _child(conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "SELECT workflow_uuid, status, name FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (f"{run_id}.episode-0",),
    ).fetchone()
    assert row is not None, "no child episode workflow"
    return dict(row)


def test_turns_per_pass_end_a_single_pass_episode(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    model = scripted_model(
        "default:\n  turns:\n" + "    - tool_use: {name: list_dir, input: {path: .}}\n" * 5
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _parent_run(conn, "look around", turns=3, passes=1))
    assert run.status is RunStatus.FAILED, run.state
    assert run.state["reason"] == "episode_ended"
    assert run.state["episode_reason"] == "turns"
    assert run.state["budget_exceeded"] is True
    assert "used all 3 turns" in run.state["error"]
    assert len(model.requests()) == 3
    assert _child(conn, run.id)["status"] == "SUCCESS"  # the child ended; the parent decided


def test_passes_restart_the_conversation_and_are_capped(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    model = scripted_model(
        "default:\n  turns:\n" + "    - tool_use: {name: list_dir, input: {path: .}}\n" * 5
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _parent_run(conn, "look around", turns=2, passes=2))
    assert run.state["episode_reason"] == "passes", run.state
    assert run.state["turns"] == 4
    requests = _episode_requests(model)
    assert [len(r["messages"]) for r in requests] == [1, 3, 1, 3]  # two fresh conversations
    assert "pass 2 of 2" in requests[2]["messages"][0]["content"]
    assert "pass 2" not in requests[0]["messages"][0]["content"]


def test_rejected_answers_are_counted_per_episode_not_per_pass(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    # Every pass answers badly twice. Two passes of two turns with a cap of two rejections:
    # a per-pass count would allow four calls; per episode, the third rejection ends it.
    model = scripted_model(
        'default:\n  turns:\n    - text: "it is the pool"\n    - text: \'{"cause": "pool"}\'\n'
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _parent_run(conn, "why?", turns=2, passes=2, rejected_answers=2))
    assert run.state["episode_reason"] == "rejected_answers", run.state
    assert run.state["budget_exceeded"] is True
    assert len(model.requests()) == 3
    # Each rejection went back to the model with what was wrong.
    second = _episode_requests(model)[1]["messages"]
    assert second[-1]["content"].startswith("Your answer was rejected: the answer is not")


def test_a_corrected_answer_is_accepted_and_validated(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    model = scripted_model(
        "default:\n  turns:\n"
        "    - tool_use: {name: read_file, input: {path: logs/checkout.log}}\n"
        '    - text: \'{"cause": "pool", "severity": "urgent"}\'\n'
        '    - text: \'Here: {"cause": "pool exhausted", "severity": "high"}\'\n'
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _parent_run(conn, "why?", turns=4, rejected_answers=1))
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert run.state["finding"] == {"cause": "pool exhausted", "severity": "high"}
    feedback = _episode_requests(model)[2]["messages"][-1]["content"]
    assert "severity" in feedback
    assert "low" in feedback  # pydantic's message names the allowed values
    # The read went through the confined tool and reached the model.
    tool_result = _episode_requests(model)[1]["messages"][2]["content"][0]
    assert "pool 10/10 in use" in tool_result["content"]


def test_a_read_outside_the_root_reaches_the_model_as_a_tool_error(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    model = scripted_model(
        "default:\n  turns:\n"
        "    - tool_use: {name: read_file, input: {path: ../investigate.py}}\n"
        '    - text: \'{"cause": "unknown", "severity": "low"}\'\n'
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _parent_run(conn, "why?", turns=3))
    assert run.status is RunStatus.SUCCEEDED, run.state
    result = _episode_requests(model)[1]["messages"][2]["content"][0]
    assert result["is_error"] is True
    assert "'../investigate.py' resolves outside the root" in result["content"]


def test_investigate_proposes_gets_approval_and_files_exactly_one_change(
    conn: Conn,
    dbos_client: Any,
    scripted_model: Callable[[str], ScriptedModelServer],
    worker: Any,
    tickets: TicketServiceThread,
) -> None:
    model = scripted_model(INVESTIGATE_SCRIPT)
    worker(
        model.url,
        agent_modules="ledgerloop.examples.investigate",
        policy_file=REPO / "tool_policy.yaml",
    )
    run_id = start_run(conn, agent="investigate", input={"message": QUESTION})
    pending = wait_until(
        lambda: conn.execute(
            "SELECT id, preview FROM ledgerloop.approval WHERE run_id = %s AND status = 'pending'",
            (run_id,),
        ).fetchone(),
        timeout=60,
    )
    assert "database.pool.max_size = 40" in str(pending["preview"])
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    approval_decide(conn, approval_id=pending["id"], principal=approver, decision="approve")
    run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert run.state["applied"] is True
    assert run.state["proposal"]["value"] == "40"
    # One ticket downstream, filed with the run's key for this call.
    stats = httpx.get(f"{tickets.url}/_stats").json()
    assert stats["created"] == 1, stats
    effects = conn.execute(
        "SELECT idempotency_key, status FROM ledgerloop.activity_effect WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    assert [(e["idempotency_key"], e["status"]) for e in effects] == [
        (f"{run_id}:remediation", "succeeded")
    ]
    # Five investigator turns, each asked once; the fourth was rejected with the reason.
    requests = _episode_requests(model)
    assert len(requests) == 5
    assert "change_config needs file, key and value" in json.dumps(requests[4]["messages"][-1])
    # The proposal is the child's recorded result, attached to the parent once.
    attached = conn.execute(
        "SELECT function_name, output FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "AND child_workflow_id = %s ORDER BY function_id",
        (str(run_id), f"{run_id}.episode-0"),
    ).fetchall()
    assert [a["function_name"] for a in attached] == ["ledgerloop_episode", "DBOS.getResult"]
    assert '"database.pool.max_size"' in attached[1]["output"]
    assert _child(conn, run_id)["name"] == "ledgerloop_episode"
    # The run's timeline shows what the episode did, under the child's workflow id.
    timeline = run_timeline(conn, run_id, steps=dbos_client)
    inside = [e for e in timeline.entries if e.detail.get("workflow_id") == f"{run_id}.episode-0"]
    assert [e.name for e in inside if "think" in e.name] == [
        f"investigator.p0.think-{i}" for i in range(5)
    ]


def test_deploy_replay_reads_the_episode_from_the_parents_journal(
    conn: Conn, db_url: str, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    import asyncio

    from ledgerloop.control.timeline import dbos_client
    from ledgerloop.deploy.check import check_runs

    model = scripted_model(
        "default:\n  turns:\n"
        "    - tool_use: {name: list_dir, input: {path: .}}\n"
        '    - text: \'{"cause": "pool exhausted", "severity": "high"}\'\n'
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run_id = _parent_run(conn, "why?", turns=3)
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    client = dbos_client(db_url)
    try:
        status = client.list_workflows(workflow_ids=[str(run_id)], load_input=True)
        [check] = asyncio.run(check_runs(client, status))
    finally:
        client.destroy()
    assert check.verdict.resumable, check.verdict
    assert "replays to its end" in check.verdict.reason
    assert check.verdict.replayed >= 4  # memory-load, the child's start and result, the save
    assert len(model.requests()) == 2  # the replay asked the model nothing


def test_deploy_adopt_moves_an_in_flight_episode_with_its_run(
    conn: Conn,
    db_url: str,
    make_settings: Callable[..., Any],
    scripted_model: Callable[[str], ScriptedModelServer],
    worker: Any,
) -> None:
    import asyncio

    from ledgerloop.deploy.adopt import deploy_adopt

    model = scripted_model(
        "default:\n  turns:\n"
        "    - tool_use: {name: list_dir, input: {path: .}}\n"
        "    - tool_use: {name: list_dir, input: {path: logs}}\n"
        "      delay_ms: 1500\n"
        '    - text: \'{"cause": "pool exhausted", "severity": "high"}\'\n'
    )
    old = worker(model.url, relay=False, agent_modules=MODULES, application_version="ll-1")
    run_id = _parent_run(conn, "why?", turns=4)
    episode = f"{run_id}.episode-0"
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.operation_outputs WHERE workflow_uuid = %s "
            "AND function_name = 'episode_reader.p0.think-0'",
            (episode,),
        ).fetchone(),
        timeout=30,
    )
    old.stop()  # mid-episode: the run and its child wait for a worker of version ll-1

    def version_and_status(workflow_id: str) -> tuple[str, str]:
        row = conn.execute(
            "SELECT application_version, status FROM dbos.workflow_status WHERE workflow_uuid = %s",
            (workflow_id,),
        ).fetchone()
        assert row is not None
        return row["application_version"], row["status"]

    assert version_and_status(episode) == ("ll-1", "ENQUEUED")
    settings = make_settings(
        application_version="ll-2", agent_modules=MODULES, anthropic_base_url=model.url
    )
    report = asyncio.run(deploy_adopt(settings, db_url))
    assert [c.run_id for c in report.adopted] == [str(run_id)], report.to_json()
    assert version_and_status(episode) == ("ll-2", "ENQUEUED")

    worker(model.url, relay=False, agent_modules=MODULES, application_version="ll-2")
    run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert run.state["finding"]["cause"] == "pool exhausted"
    assert version_and_status(episode) == ("ll-2", "SUCCESS")


def test_cancelling_a_run_cancels_its_episode(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    from dbos import DBOS

    from ledgerloop.control.cancel import cancel_run

    model = scripted_model(
        "default:\n  turns:\n"
        "    - tool_use: {name: list_dir, input: {path: .}}\n"
        "    - tool_use: {name: list_dir, input: {path: logs}}\n"
        "      delay_ms: 2000\n"
        '    - text: \'{"cause": "pool exhausted", "severity": "high"}\'\n'
    )
    worker(model.url, relay=False, agent_modules=MODULES)
    run_id = _parent_run(conn, "why?", turns=4)
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = %s AND status = 'PENDING'",
            (f"{run_id}.episode-0",),
        ).fetchone(),
        timeout=30,
    )
    cancelled = cancel_run(conn, run_id, workflows=DBOS, requested_by="test")
    assert cancelled.workflow_cancelled
    # The episode stops with its run: no more turns paid for a run nobody waits for.
    assert _child(conn, run_id)["status"] == "CANCELLED"
    assert wait_terminal(conn, run_id).status is RunStatus.CANCELLED


# -- the run's budgets: a child spends them, and the parent sees what it used --------------

#: Four reads, then an answer, for the child; one answer for the parent's own turn.
SPENDING_SCRIPT = """
conversations:
  - match: "PARENT TURN"
    turns:
      - text: "the parent's own turn"
        output_tokens: OUT
default:
  turns:
    - tool_use: {name: list_dir, input: {path: .}}
      output_tokens: OUT
    - tool_use: {name: list_dir, input: {path: logs}}
      output_tokens: OUT
    - tool_use: {name: list_dir, input: {path: .}}
      output_tokens: OUT
    - tool_use: {name: list_dir, input: {path: logs}}
      output_tokens: OUT
    - text: '{"cause": "pool exhausted", "severity": "high"}'
      output_tokens: OUT
"""


def _spending_run(conn: Conn) -> uuid.UUID:
    return start_run(conn, agent="episode_spending_parent", input={"message": "why?"})


def _asked_by_parent(model: ScriptedModelServer) -> int:
    return sum("PARENT TURN" in json.dumps(r["request"]["messages"][0]) for r in model.requests())


def test_a_child_spends_the_runs_iterations_and_cannot_outspend_them(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    """The run may take 3 model turns: the child (its own budget allows 10) takes the 3 and
    ends for the run's budget, and the parent's own turn is refused before the model is
    asked: the run fails with iteration_cap."""
    model = scripted_model(SPENDING_SCRIPT.replace("OUT", "10"))
    worker(model.url, relay=False, agent_modules=MODULES, max_iterations=3)
    run = wait_terminal(conn, _spending_run(conn))
    assert (run.status, run.state.get("reason")) == (RunStatus.FAILED, "iteration_cap"), run.state
    assert run.state["max_iterations"] == 3
    assert run.state["spent"]["turns"] == 3
    assert len(model.requests()) == 3
    assert _asked_by_parent(model) == 0
    assert _child(conn, run.id)["status"] == "SUCCESS"  # the child ended; the parent decided


def test_a_child_spends_the_runs_tokens_and_cannot_outspend_them(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    """8,000 tokens for the run, 5,000 output tokens a turn: the child's second turn crosses
    the budget (checked before each call, so that call is the last), and nothing more is
    asked, of the child or of the parent."""
    model = scripted_model(SPENDING_SCRIPT.replace("OUT", "5000"))
    worker(model.url, relay=False, agent_modules=MODULES, max_run_tokens=8000)
    run = wait_terminal(conn, _spending_run(conn))
    assert (run.status, run.state.get("reason")) == (RunStatus.FAILED, "token_budget"), run.state
    assert run.state["max_run_tokens"] == 8000
    spent = run.state["spent"]
    assert spent["turns"] == 2
    assert spent["output_tokens"] == 10_000
    assert spent["input_tokens"] > 0
    assert len(model.requests()) == 2
    assert _asked_by_parent(model) == 0


def test_the_parent_sees_the_turns_and_tokens_its_child_used(
    conn: Conn, scripted_model: Callable[[str], ScriptedModelServer], worker: Any
) -> None:
    model = scripted_model(SPENDING_SCRIPT.replace("OUT", "100"))
    worker(model.url, relay=False, agent_modules=MODULES)
    run = wait_terminal(conn, _spending_run(conn))
    assert run.status is RunStatus.SUCCEEDED, run.state
    assert run.state["episode"] == {"finding": {"cause": "pool exhausted", "severity": "high"}}
    after_episode = run.state["after_episode"]
    assert after_episode["turns"] == 5
    assert after_episode["output_tokens"] == 500
    assert after_episode["input_tokens"] > 0
    # Then the parent's own turn, counted on top of the child's.
    assert run.state["parent_said"] == "the parent's own turn"
    spent = run.state["spent"]
    assert spent["turns"] == 6
    assert spent["output_tokens"] == 600
    assert spent["input_tokens"] > after_episode["input_tokens"]
    assert len(model.requests()) == 6
