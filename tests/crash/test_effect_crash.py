"""Kill the relay or the worker (SIGKILL, real subprocesses) at each named fault point, for each
kind of downstream, then restart what died and check the invariants (a worker that runs the
relay sends its effects itself, and is killed at the relay's points too):

- at most one ticket per logical call, and exactly one when the run says it succeeded;
- every run ends terminal, or waits in `reconciling` on an effect parked as needs_human;
- no effect is left pending, started or unknown: each has settled or is parked for a person.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, start_relay, start_worker, stop_worker, worker_env
from tests.conftest import start_test_run

pytestmark = pytest.mark.crash

KINDS = {"idempotent": "ticket_idempotent", "lookup": "ticket_lookup", "plain": "ticket_plain"}
RELAY_FAULTS = ["relay.before_send", "relay.after_send_before_record", "relay.after_record"]
WORKER_FAULTS = ["loop.after_effect_recorded", "loop.after_tools"]


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


class Cluster:
    """A worker and a relay process; either can be started with faults and restarted."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, role: str, faults: str = "") -> subprocess.Popen[bytes]:
        env = {**self.env, "LEDGERLOOP_FAULTS": faults}
        log = self.logs / f"{role}-{len(self.procs)}.log"
        if role == "worker":
            proc = start_worker(env, "--no-relay", log=log)
        elif role == "delivering worker":  # runs the relay: its act steps send themselves
            proc = start_worker(env, log=log)
        else:
            proc = start_relay(env, log=log)
        self.procs[f"{role}-{len(self.procs)}"] = proc
        return proc

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_worker(proc)

    def output(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in self.logs.glob("*.log"))


@pytest.fixture
def cluster(
    db_url: str, scripted_model: Any, tickets: TicketServiceThread, tmp_path: Path
) -> Iterator[Any]:
    clusters: list[Cluster] = []

    def make(script: str) -> Cluster:
        model = scripted_model(script)
        env = worker_env(
            db_url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_AGENT_MODULES="tests.support.agents",
            LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
            LEDGERLOOP_EFFECT_SETTLE_AFTER_S="0.2",
            LEDGERLOOP_RECONCILE_INTERVAL_S="0.2",
            LEDGERLOOP_RELAY_LEASE_MARGIN_S="1",
        )
        made = Cluster(env, tmp_path)
        clusters.append(made)
        return made

    yield make
    for made in clusters:
        made.stop()


def _settled(conn: Conn, run_id: uuid.UUID) -> bool:
    status = run_require(conn, run_id).status
    if status in TERMINAL:
        return True
    # Parked: the effect waits for a person and the run has heard so.
    parked = effect_list(conn, run_id=run_id, status="needs_human")
    return bool(parked) and status is RunStatus.RECONCILING


def _check_invariants(conn: Conn, run_id: uuid.UUID, tickets: TicketServiceThread) -> None:
    run = run_require(conn, run_id)
    created = httpx.get(f"{tickets.url}/_stats").json()["created"]
    effects = effect_list(conn, run_id=run_id)
    assert created <= 1
    assert all(e.status.value in ("succeeded", "failed", "needs_human") for e in effects), effects
    if run.status is RunStatus.SUCCEEDED:
        assert created == 1
        assert [e.status.value for e in effects] == ["succeeded"]
    else:
        assert run.status is RunStatus.RECONCILING
        assert [e.status.value for e in effects] == ["needs_human"]


def _script(tool: str) -> str:
    first = f"{{tool_use: {{name: {tool}, input: {{title: crash}}}}}}"
    return f"default: {{turns: [{first}, {{text: done}}]}}"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("fault", RELAY_FAULTS)
@pytest.mark.parametrize("sender", ["relay", "delivering worker"])
def test_sender_killed(
    sender: str, fault: str, kind: str, conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    """The relay, or a worker that runs it (its act steps send their own effects), killed at
    each point of a delivery attempt; the restarted sender settles what it left."""
    c = cluster(_script(KINDS[kind]))
    if sender == "relay":
        c.start("worker")
    victim = c.start(sender, fault)
    run_id = start_test_run(conn, "writer", "file one")
    assert victim.wait(timeout=60) == -9, c.output()
    c.start(sender)
    wait_until(lambda: _settled(conn, run_id), timeout=60)
    _check_invariants(conn, run_id, tickets)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("fault", WORKER_FAULTS)
def test_worker_killed(
    fault: str, kind: str, conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    c = cluster(_script(KINDS[kind]))
    worker = c.start("worker", fault)
    c.start("relay")
    run_id = start_test_run(conn, "writer", "file one")
    assert worker.wait(timeout=60) == -9, c.output()
    c.start("worker")
    wait_until(lambda: _settled(conn, run_id), timeout=60)
    _check_invariants(conn, run_id, tickets)
    if run_require(conn, run_id).status is RunStatus.SUCCEEDED:
        # The resumed run did not ask the model about the tool call again.
        assert run_require(conn, run_id).state["turns"] == 2


@pytest.mark.parametrize("kind", list(KINDS))
def test_delivering_worker_killed_inside_the_think_step_that_wrote(
    kind: str, conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    """A plain write rides the next think step (agent.turn_tools). A worker that sends its
    own effects, killed in that step once the downstream has answered and before the model
    call (its outcome's record may still be under way, as at relay.after_send_before_record):
    the restarted worker repeats the step and finds the effect by its key. The reconciler
    settles an effect left started: by its lookup or a resend under the same key, or, for a
    destination with neither, by parking it for a person (the run then waits)."""
    c = cluster(_script(KINDS[kind]))
    victim = c.start("delivering worker", "think.after_tools")
    run_id = start_test_run(conn, "writer", "file one")
    assert victim.wait(timeout=60) == -9, c.output()
    c.start("delivering worker")
    wait_until(lambda: _settled(conn, run_id), timeout=60)
    _check_invariants(conn, run_id, tickets)
    run = run_require(conn, run_id)
    if kind != "plain":
        assert run.status is RunStatus.SUCCEEDED, c.output()
    if run.status is RunStatus.SUCCEEDED:
        assert run.state["turns"] == 2


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("idempotent", "write_ahead.before_send"),
        ("lookup", "write_ahead.before_send"),
        ("idempotent", "step.after:think-0"),
    ],
)
def test_delivering_worker_killed_between_the_answer_and_the_step_that_sends(
    kind: str, fault: str, conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    """A write that opens a plain turn is recorded with the checkpoint of the think step
    whose answer asked for it (agent.write_ahead), claimed by the worker's own relay, and
    sent once that commit is in. That worker, killed after the commit and before the send
    (`write_ahead.before_send`), or once think-0's step is over, with the send under way or
    done (`step.after:think-0`): the restarted worker repeats the next step and finds the
    effect by its key (settled already, or under the dead worker's claim: then, once the
    lease is out, the reconciler settles it by a resend under the key or a lookup), and the
    ticket is filed once."""
    c = cluster(_script(KINDS[kind]))
    victim = c.start("delivering worker", fault)
    run_id = start_test_run(conn, "writer", "file one")
    assert victim.wait(timeout=60) == -9, c.output()
    (effect,) = effect_list(conn, run_id=run_id)
    if fault == "write_ahead.before_send":
        assert effect.status.value == "started"
        assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 0
    recorded = conn.execute(
        "SELECT e.xmin::text = o.xmin::text AS together FROM ledgerloop.agent_run_event e, "
        "dbos.operation_outputs o WHERE e.run_id = %(id)s AND e.event_type = 'executing' "
        "AND o.workflow_uuid = %(id)s::text AND o.function_name = 'think-0'",
        {"id": run_id},
    ).fetchone()
    assert recorded is not None
    assert recorded["together"], "the write was not recorded with think-0's checkpoint"
    c.start("delivering worker")
    wait_until(lambda: _settled(conn, run_id), timeout=60)
    _check_invariants(conn, run_id, tickets)
    run = run_require(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, c.output()
    assert run.state["turns"] == 2


def test_a_run_begun_before_writes_rode_the_think_step_keeps_its_write_step(
    conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    """A run whose memory-load predates writes inside the think step (its journaled result
    has no `writes_in_think`) is resumed by this code: its write keeps its own step, so such
    a journal replays, and the ticket is filed once."""
    c = cluster(_script(KINDS["idempotent"]))
    victim = c.start("delivering worker", "step.after:memory-load")
    run_id = start_test_run(conn, "writer", "file one")
    assert victim.wait(timeout=60) == -9, c.output()
    (row,) = conn.execute(
        "SELECT output FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "AND function_name = 'memory-load'",
        (str(run_id),),
    ).fetchall()
    loaded = json.loads(row["output"])
    assert loaded.pop("writes_in_think") is True
    conn.execute(
        "UPDATE dbos.operation_outputs SET output = %s WHERE workflow_uuid = %s "
        "AND function_name = 'memory-load'",
        (json.dumps(loaded), str(run_id)),
    )
    c.start("delivering worker")
    wait_until(lambda: _settled(conn, run_id), timeout=60)
    _check_invariants(conn, run_id, tickets)
    assert run_require(conn, run_id).status is RunStatus.SUCCEEDED, c.output()
    steps = conn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "ORDER BY function_id",
        (str(run_id),),
    ).fetchall()
    names = [s["function_name"].split("-toolu_")[0] for s in steps]
    assert names == ["memory-load", "think-0", "tool-0", "think-1"]


COMPENSATE = """
default:
  turns:
    - tool_use: {name: ticket_undoable, input: {title: "to be undone"}}
    - status: 500
"""


@pytest.mark.parametrize(
    ("role", "fault"),
    [("worker", "loop.after_compensation_recorded"), ("relay", "relay.before_send_compensation")],
)
def test_killed_during_compensation(
    role: str, fault: str, conn: Conn, cluster: Any, tickets: TicketServiceThread
) -> None:
    c = cluster(COMPENSATE)
    first_worker = c.start("worker", fault if role == "worker" else "")
    first_relay = c.start("relay", fault if role == "relay" else "")
    run_id = start_test_run(conn, "writer", "file then fail")
    victim = first_worker if role == "worker" else first_relay
    assert victim.wait(timeout=60) == -9, c.output()
    c.start(role)
    run = wait_until(lambda: (r := run_require(conn, run_id)).status in TERMINAL and r, timeout=60)
    assert run.status is RunStatus.FAILED
    stats = httpx.get(f"{tickets.url}/_stats").json()
    assert stats["created"] == 1
    assert stats["closed"] == 1
    statuses = sorted(e.status.value for e in effect_list(conn, run_id=run_id))
    assert statuses == ["succeeded", "succeeded"]
