"""One trace per run across a SIGKILL: exported over OTLP/HTTP from real worker processes to a
real receiver, the run's spans form one tree under one root, with nothing orphaned by the kill
and nothing emitted twice by the replay.

Three kills: while the run waits for an approval; after the approval is requested but before
its step is recorded (decided while no worker runs the run: the wait still has its span); and
while a model call is in flight (that call is then reported lost: a span and a metric point,
as many chat spans as requests).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.telemetry.runtrace import root_span_id
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal
from tests.support.otlp import Receiver, running_receiver

pytestmark = pytest.mark.crash


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def _env(db_url: str, receiver: Receiver, **extra: str) -> dict[str, str]:
    defaults = {
        "LEDGERLOOP_AGENT_MODULES": "ledgerloop.examples.ops_agent,tests.support.agents",
        # The test agents' write tools are listed there (a worker refuses unlisted ones).
        "LEDGERLOOP_POLICY_FILE": str(REPO / "tests" / "support" / "policy.yaml"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    return worker_env(db_url, **{**defaults, **extra})


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def _one_tree(receiver: Receiver, run_id: uuid.UUID) -> dict[str, list[Any]]:
    """The run's spans, checked to be exactly one trace with one root and no orphans or
    duplicates; returned by name."""
    spans = receiver.spans()
    mine = [s for s in spans if _attrs(s).get("ledgerloop.run.id") == str(run_id)]
    # Every span about the run is in the trace whose id is the run id...
    assert mine
    assert all(int.from_bytes(s.trace_id, "big") == run_id.int for s in mine)
    trace = [s for s in spans if int.from_bytes(s.trace_id, "big") == run_id.int]
    ids = [s.span_id for s in trace]
    assert len(ids) == len(set(ids)), "a span was exported twice"
    roots = [s for s in trace if not s.parent_span_id]
    assert len(roots) == 1, [r.name for r in roots]
    assert roots[0].name.startswith("invoke_agent ")
    assert int.from_bytes(roots[0].span_id, "big") == root_span_id(run_id.int)
    orphans = [s.name for s in trace if s.parent_span_id and s.parent_span_id not in set(ids)]
    assert orphans == [], f"spans whose parent never arrived: {orphans}"
    # A replay emits nothing: each step's model call and tool call is one span, whatever the
    # crash (a replayed span would carry fresh ids, so the id check above cannot see it). A
    # call lost with its execution is the one exception, and it is marked.
    per_step: dict[tuple[Any, ...], int] = {}
    for span in trace:
        attrs = _attrs(span)
        if span.name.startswith(("chat ", "execute_tool ")) and not attrs.get(
            "ledgerloop.call.lost"
        ):
            step = attrs.get("ledgerloop.step.name")
            assert step, f"{span.name} has no step name"
            key: tuple[Any, ...] = (span.name, step)
            if span.name.startswith("execute_tool ") and "think-" in str(step):
                # A turn's reads ride the next think step: an execution cut off inside it
                # ran them, and the next execution runs them again, so they count once per
                # execution. A replay of the step would still show in its chat span.
                key = (*key, span.parent_span_id)
            per_step[key] = per_step.get(key, 0) + 1
    assert per_step
    repeated = {key: n for key, n in per_step.items() if n > 1}
    assert repeated == {}, f"spans emitted again for one step: {repeated}"
    by_name: dict[str, list[Any]] = {}
    for span in sorted(trace, key=lambda s: s.start_time_unix_nano):
        by_name.setdefault(span.name, []).append(span)
    return by_name


def test_killed_while_waiting_for_approval_still_one_trace(
    conn: Conn, db_url: str, scripted_model: Any, receiver: Receiver, tmp_path: Path
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
            - text: "Filed."
        """
    )
    with TicketServiceThread() as tickets:
        env = _env(
            db_url,
            receiver,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        )
        approver, _ = principal_create(conn, name="alice", roles=["approver"])
        with worker_process(env, log=tmp_path / "w1.log") as first:
            run_id = start_test_run(conn, "ops", "db-1 disk is full")
            wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=60)
            # Killed in the wait itself, with the approve step recorded (a kill between the
            # request and that record is the next test's case).
            wait_until(lambda: _recorded(conn, run_id, "approve-%"), timeout=30)
            # The first execution's model call is out of the process before the kill: its
            # parent (that execution) must still arrive, from the execution taking over.
            wait_until(lambda: "chat claude-haiku-4-5" in receiver.span_names(), timeout=30)
            first.kill()
            assert first.wait(timeout=30) == -9
        with worker_process(env, log=tmp_path / "w2.log"):
            (approval,) = approval_list(conn, run_id=run_id, status="pending")
            approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
            run = wait_terminal(conn, run_id, timeout=60)
            assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
            sent = httpx.get(f"{tickets.url}/_traceparents").json()
        # Leaving the block stops the worker with SIGTERM, which flushes its exporters.

    spans = _one_tree(receiver, run_id)
    killed, resumed = spans["execution ops"]
    assert killed.status.code == killed.status.STATUS_CODE_ERROR
    assert _attrs(killed)["error.type"] == "execution_interrupted"
    assert _attrs(resumed)["ledgerloop.execution.resumed"] is True
    (chat0, chat1) = spans["chat claude-haiku-4-5"]
    assert chat0.parent_span_id == killed.span_id
    assert chat1.parent_span_id == resumed.span_id
    # Killed in a wait, not in a call: nothing was lost, the model answered each turn once.
    assert not any("ledgerloop.call.lost" in _attrs(c) for c in (chat0, chat1))
    assert [r["turn"] for r in model.requests()] == [0, 1]
    # The write tool's span once, though its approve step ran in the killed execution and
    # its effect step in the resumed one.
    (_tool,) = spans["execute_tool write_ticket"]
    (wait,) = spans["await_approval write_ticket"]
    assert _attrs(wait)["ledgerloop.approval.id"] == str(approval.id)
    assert _attrs(wait)["ledgerloop.wait.duration_s"] > 0
    # The downstream received the delivery span's context: its trace id is the run's.
    (post,) = spans["POST"]
    assert sent == [f"00-{run_id.hex}-{post.span_id.hex()}-01"]


def test_a_decision_made_while_no_worker_waited_still_has_its_wait_span(
    conn: Conn, db_url: str, scripted_model: Any, receiver: Receiver, tmp_path: Path
) -> None:
    """The worker dies after the approval row commits, before its step is recorded; a person
    decides while no worker runs the run. The resumed execution finds the decision in its
    first look at the approval (no recv at all), and still reports the wait: from the request
    to the decision."""
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: write_ticket, input: {title: "db-2 disk full", priority: high}}
            - text: "Filed."
        """
    )
    with TicketServiceThread() as tickets:
        env = _env(
            db_url,
            receiver,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        )
        approver, _ = principal_create(conn, name="bob", roles=["approver"])
        with worker_process(
            {**env, "LEDGERLOOP_FAULTS": "approval.after_request"}, log=tmp_path / "w1.log"
        ) as first:
            run_id = start_test_run(conn, "ops", "db-2 disk is full")
            assert first.wait(timeout=60) == -9
        assert not _recorded(conn, run_id, "approve-%")
        (approval,) = approval_list(conn, run_id=run_id, status="pending")
        decided = approval_decide(
            conn, approval_id=approval.id, principal=approver, decision="approve"
        )
        with worker_process(env, log=tmp_path / "w2.log"):
            run = wait_terminal(conn, run_id, timeout=60)
            assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()

    spans = _one_tree(receiver, run_id)
    (wait,) = spans["await_approval write_ticket"]
    _, resumed = spans["execution ops"]
    assert wait.parent_span_id == spans["invoke_agent ops"][0].span_id
    assert _attrs(wait)["ledgerloop.approval.id"] == str(approval.id)
    assert _attrs(wait)["ledgerloop.approval.decision"] == "approved"
    assert wait.start_time_unix_nano == int(approval.requested_at.timestamp() * 1e9)
    decided_at = decided.approval.decided_at
    assert decided_at is not None
    assert wait.end_time_unix_nano == int(decided_at.timestamp() * 1e9)
    # It ended before the execution that found it began.
    assert wait.end_time_unix_nano < resumed.start_time_unix_nano
    assert [r["turn"] for r in model.requests()] == [0, 1]


def _recorded(conn: Conn, run_id: uuid.UUID, step_like: str) -> bool:
    row = conn.execute(
        "SELECT count(*) AS n FROM dbos.operation_outputs"
        " WHERE workflow_uuid = %s AND function_name LIKE %s",
        (str(run_id), step_like),
    ).fetchone()
    return bool(row and row["n"])


def test_killed_during_a_model_call_reports_the_lost_call(
    conn: Conn, db_url: str, scripted_model: Any, receiver: Receiver, tmp_path: Path
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: echo, input: {text: once}}
            # The first attempt hangs (the worker is killed meanwhile); the retry answers.
            - {status: 500, times: 1, delay_ms: 60000, then: {text: finished}}
        """
    )
    env = _env(
        db_url,
        receiver,
        ANTHROPIC_BASE_URL=model.url,
        OTEL_METRIC_EXPORT_INTERVAL="200",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
    )
    with worker_process(env, log=tmp_path / "w1.log") as first:
        run_id = start_test_run(conn, "looper", "echo please")
        wait_until(lambda: len(model.requests()) == 2, timeout=60)
        wait_until(lambda: "execute_tool echo" in receiver.span_names(), timeout=30)
        first.kill()
        assert first.wait(timeout=30) == -9
    with worker_process(env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=60)
        assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()

    spans = _one_tree(receiver, run_id)
    killed, resumed = spans["execution looper"]
    assert _attrs(killed)["error.type"] == "execution_interrupted"
    # The provider got three requests; the trace shows three calls, the lost one marked.
    assert [r["turn"] for r in model.requests()] == [0, 1, 1]
    chats = spans["chat claude-haiku-4-5"]
    assert len(chats) == 3
    lost = [c for c in chats if _attrs(c).get("ledgerloop.call.lost")]
    assert len(lost) == 1
    assert lost[0].parent_span_id == killed.span_id
    assert _attrs(lost[0])["error.type"] == "execution_interrupted"
    assert _attrs(lost[0])["ledgerloop.step.name"] == "think-1"
    assert [c.parent_span_id for c in chats if c is not lost[0]] == [
        killed.span_id,
        resumed.span_id,
    ]
    assert _lost_calls(receiver) == 1
    # The lost call was the same request as its replacement: it says how many tokens it
    # could have cost.
    assert _attrs(lost[0])["gen_ai.request.max_tokens"] == 2048
    assert all(_attrs(c)["gen_ai.request.max_tokens"] == 2048 for c in chats)
    # The root's totals are the run's, over both executions (the lost call's tokens were
    # never reported, so they are not in them).
    (root,) = spans["invoke_agent looper"]
    answered = [_attrs(c) for c in chats if c is not lost[0]]
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        assert _attrs(root)[key] == sum(a[key] for a in answered) > 0


def _lost_calls(receiver: Receiver) -> int:
    with receiver.lock:
        bodies = list(receiver.bodies.get("/v1/metrics", []))
    total = 0
    for body in bodies:
        request = ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "ledgerloop.agent.lost_calls":
                        # Cumulative sums: the last export of the process holds the total.
                        total = max(total, sum(p.as_int for p in metric.sum.data_points))
    return total
