"""The crash matrix: run an agent through a scripted conversation, SIGKILL a real worker or
relay at one boundary, restart it, let the run settle, and check the invariants.

A boundary is a named fault point (`ledgerloop.faults`) in one process role, or a kill from
outside while the run waits for approval. `crash_matrix()` lists the boundaries a durable agent
must survive (the side-effect, approval and compensation boundaries, and a kill after every
step the conversation records); `CrashHarness.check()` runs one of them end to end.

The invariants, checked after every kill:

- at most one real side effect per logical call (idempotency key; a request that came without
  one, or with a key the ledger does not know, by its method, path and body), and exactly one
  for every effect the ledger says succeeded when the run succeeded;
- the run is terminal, or visibly parked for a person (waiting for approval, or reconciling an
  effect marked needs_human);
- no model turn whose answer was recorded is requested again;
- no effect is left pending, started or outcome_unknown without a process that will settle it.

A failed invariant raises `CrashInvariantError`, which names the boundary and shows the run's
timeline.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.testing.downstream import RecordingDownstream
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_relay, start_worker, worker_env

Role = Literal["worker", "relay"]

TERMINAL = ("succeeded", "failed", "cancelled")
SETTLED_EFFECTS = ("succeeded", "failed", "needs_human")


class CrashInvariantError(AssertionError):
    """An invariant failed after a kill; the message names the boundary and the timeline."""


@dataclass(frozen=True)
class Boundary:
    """Where a process dies: a fault point in `role`, or (`while_waiting`) an outside kill of
    the worker while the run waits for approval."""

    name: str
    role: Role
    fault: str | None = None
    while_waiting: bool = False

    def __str__(self) -> str:
        return self.name


EFFECT_BOUNDARIES = (
    Boundary("before the side effect is sent", "relay", "relay.before_send"),
    Boundary(
        "after sending, before the outcome is stored", "relay", "relay.after_send_before_record"
    ),
    Boundary("after storing the outcome, before delivery closes", "relay", "relay.after_record"),
    Boundary(
        "after the effect is recorded, before the run advances",
        "worker",
        "loop.after_effect_recorded",
    ),
)
APPROVAL_BOUNDARIES = (
    Boundary("while waiting for approval", "worker", while_waiting=True),
    Boundary("after approval, before execution", "worker", "loop.after_approval"),
)
COMPENSATION_BOUNDARIES = (
    Boundary("during compensation (worker)", "worker", "loop.after_compensation_recorded"),
    Boundary("during compensation (relay)", "relay", "relay.before_send_compensation"),
)
#: A turn of read tools runs inside the next think step, and its results are journaled with
#: that step's model call: a worker killed between the two runs the reads again. A read with a
#: side effect (a refund sent from a read tool, bypassing the outbox) is performed twice here
#: and at no other boundary. `think.after_tools` is the same place for a turn that also holds
#: plain writes (its reads ran, its writes were recorded, the step was not).
READS_BOUNDARY = Boundary(
    "after a turn's reads ran, before their step is recorded",
    "worker",
    "think.after_reads,think.after_tools",
)
#: The first think step killed after everything but the model call: the repeat must ask the
#: model once, and not lose the run.
MODEL_CALL_BOUNDARY = Boundary("before the model call", "worker", "think.before_model_call")


def _exits(proc: subprocess.Popen[bytes], within: float) -> bool:
    """Whether `proc` ends within `within` seconds. A process that hit its fault point may
    still be on its way out when the run it left behind has already settled (the relay
    killed right after recording an outcome, say): give it a moment before calling the
    boundary unreached."""
    try:
        proc.wait(within)
    except subprocess.TimeoutExpired:
        return False
    return True


def step_boundary(step: str) -> Boundary:
    """A worker killed right after `step` was recorded. A trailing `*` matches a prefix (tool
    steps carry the model's call id: `tool-0-*`)."""
    return Boundary(f"after step {step}", "worker", f"step.after:{step}")


def crash_matrix(
    *,
    steps: Iterable[str] = (),
    effects: bool = True,
    approval: bool = False,
    compensation: bool = False,
    reads: bool = False,
    model_call: bool = False,
) -> list[Boundary]:
    """The boundaries a conversation reaches: the effect ones when it has a write tool, the
    approval ones when a call needs approval, the compensation ones when the run fails after
    a compensable effect, the kill between a turn's reads and their step's record when
    `reads` (the conversation asks for read tools), the kill before the first model call when
    `model_call`, and one kill after each recorded step in `steps`."""
    cases: list[Boundary] = []
    if effects:
        cases += EFFECT_BOUNDARIES
    if approval:
        cases += APPROVAL_BOUNDARIES
    if compensation:
        cases += COMPENSATION_BOUNDARIES
    if reads:
        cases.append(READS_BOUNDARY)
    if model_call:
        cases.append(MODEL_CALL_BOUNDARY)
    cases += [step_boundary(s) for s in steps]
    return cases


@dataclass
class Outcome:
    """What one run of the matrix left behind, for further assertions of the test's own."""

    boundary: Boundary
    run_id: uuid.UUID
    status: str
    state: dict[str, Any]
    effects: list[dict[str, Any]]
    timeline: str


@dataclass
class CrashHarness:
    """Processes and servers for one crash case; `check()` drives it.

    `env` holds what the worker and relay need besides the database (agent modules, policy
    file, model URL, destinations); the plugin's `ledgerloop_crash` fixture builds it.

    `one_process`: one worker that runs the relay (`ledgerloop up`), whose act steps send
    their effects themselves, instead of a worker and a relay apart (`ledgerloop up
    --no-relay` and `ledgerloop relay`). Every boundary's fault point is then in that
    worker, which is the process killed and restarted.
    """

    database_url: str
    model: ScriptedModelServer
    downstream: RecordingDownstream
    env: dict[str, str]
    logs: Path
    approver_token: str | None = None
    one_process: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- processes -----------------------------------------------------------------------

    def _start(self, role: Role, faults: str = "") -> subprocess.Popen[bytes]:
        env = {**worker_env(self.database_url), **self.env, "LEDGERLOOP_FAULTS": faults}
        log = self.logs / f"{role}-{len(self.procs)}.log"
        if role == "relay":
            proc = start_relay(env, log=log)
        elif self.one_process:
            proc = start_worker(env, log=log)
        else:
            proc = start_worker(env, "--no-relay", log=log)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        # The case is over and its database is dropped next: nothing to drain.
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def output(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    # -- the database, read the way an operator would ---------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as conn:
            yield conn

    def _run(self, run_id: uuid.UUID) -> dict[str, Any]:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT status, state FROM ledgerloop.agent_run WHERE id = %s", (run_id,)
            ).fetchone()
        assert row is not None, f"run {run_id} does not exist"
        return row

    def _effects(self, run_id: uuid.UUID) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return conn.execute(
                "SELECT idempotency_key, tool, status FROM ledgerloop.activity_effect"
                " WHERE run_id = %s ORDER BY created_at",
                (run_id,),
            ).fetchall()

    def _pending_approvals(self, run_id: uuid.UUID) -> list[uuid.UUID]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT id FROM ledgerloop.approval WHERE run_id = %s AND status = 'pending'",
                (run_id,),
            ).fetchall()
        return [r["id"] for r in rows]

    def approve_pending(self, run_id: uuid.UUID) -> int:
        """Approve every pending approval of the run, as the harness's approver."""
        pending = self._pending_approvals(run_id)
        for approval_id in pending:
            self.decide(approval_id, "approve")
        return len(pending)

    def decide(self, approval_id: uuid.UUID, decision: str) -> Delivery:
        """Decide an approval through the authenticated path, as the harness's approver (a
        principal with the approver and operator roles, created on first use)."""
        from ledgerloop.approvals.errors import ApprovalError
        from ledgerloop.approvals.principals import principal_authenticate, principal_create
        from ledgerloop.approvals.store import approval_decide

        with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as conn:
            if self.approver_token is None:
                _, self.approver_token = principal_create(
                    conn, name="crash-matrix approver", roles=["approver", "operator"]
                )
            principal = principal_authenticate(conn, self.approver_token)
            try:
                result = approval_decide(
                    conn, approval_id=approval_id, principal=principal, decision=decision
                )
            except ApprovalError as exc:
                return Delivery(decision, "refused", str(exc))
        return Delivery(decision, str(result.outcome.value), "")

    def _settled(self, run_id: uuid.UUID, approve: bool) -> bool:
        run = self._run(run_id)
        if run["status"] in TERMINAL:
            return True
        if run["status"] == "awaiting_approval":
            # Parked for a person only while an approval is pending; once one is decided the
            # run is about to move on.
            if not self._pending_approvals(run_id):
                return False
            if approve:
                self.approve_pending(run_id)
                return False
            return True
        if run["status"] == "reconciling":
            return any(e["status"] == "needs_human" for e in self._effects(run_id))
        return False

    def timeline(self, run_id: uuid.UUID) -> str:
        from ledgerloop.control.timeline import dbos_client, run_timeline

        with self._conn() as conn:
            client = dbos_client(self.database_url)
            try:
                entries = run_timeline(conn, run_id, steps=client).entries
            finally:
                client.destroy()
        return "\n".join(f"  {e.at:%H:%M:%S.%f} {e.kind:<9} {e.name} {e.detail}" for e in entries)

    # -- driving a run by hand (event abuse, custom scenarios) ------------------------------

    @property
    def events(self) -> ApprovalEvents:
        """Deliver this run's approval decisions twice, in reverse order, or after expiry."""
        return ApprovalEvents(self)

    def start(self, *, agent: str, input: Mapping[str, Any]) -> uuid.UUID:
        """Start a worker and a relay (unarmed) if none runs, then the run."""
        from ledgerloop.runs.start import start_run

        if not any(p.poll() is None for p in self.procs):
            self._start("worker")
            self._start("relay")
        with self._conn() as conn:
            return start_run(conn, agent=agent, input=dict(input))

    def wait_for_approval(self, run_id: uuid.UUID, timeout: float = 60) -> uuid.UUID:
        """The id of the approval the run waits for, once it waits."""
        found = wait_until(lambda: self._pending_approvals(run_id), timeout)
        assert isinstance(found, list)
        approval_id: uuid.UUID = found[0]
        return approval_id

    def settle(self, run_id: uuid.UUID, *, approve: bool = False, timeout: float = 60) -> Outcome:
        """Wait until the run is terminal or parked for a person, then check the invariants."""
        wait_until(lambda: self._settled(run_id, approve), timeout)
        return self._invariants(Boundary("no crash", "worker"), run_id)

    # -- the case --------------------------------------------------------------------------

    def check(
        self,
        boundary: Boundary,
        *,
        agent: str,
        input: Mapping[str, Any],
        approve: bool = True,
        timeout: float = 60,
    ) -> Outcome:
        """Start the run with `boundary`'s process armed, wait for that process to die, restart
        it unarmed, let the run settle (approving what it asks for when `approve`), and check
        the invariants. Returns what the run left behind."""
        from ledgerloop.runs.start import start_run

        faults = boundary.fault or ""
        role: Role = "worker" if self.one_process else boundary.role
        if self.one_process:
            victim = self._start("worker", faults)
        else:
            worker = self._start("worker", faults if role == "worker" else "")
            relay = self._start("relay", faults if role == "relay" else "")
            victim = worker if role == "worker" else relay
        with self._conn() as conn:
            run_id = start_run(conn, agent=agent, input=dict(input))

        if boundary.while_waiting:
            wait_until(lambda: self._run(run_id)["status"] == "awaiting_approval", timeout)
            victim.kill()
            victim.wait()
        else:
            # Drive the run (approving as asked) until the armed process kills itself.
            def died() -> bool:
                if victim.poll() is not None:
                    return True
                if self._settled(run_id, approve) and not _exits(victim, 5.0):
                    raise CrashInvariantError(
                        f"boundary {boundary}: the run settled ({self._run(run_id)['status']}) "
                        "without reaching "
                        f"the fault point {boundary.fault!r}; this conversation never crosses it, "
                        "so leave it out of the matrix"
                    )
                return False

            wait_until(died, timeout)
            assert victim.returncode == -9, (
                f"boundary {boundary}: the {role} exited {victim.returncode}, not by "
                f"SIGKILL at the fault point\n{self.output()}"
            )
        self._start(role)
        try:
            wait_until(lambda: self._settled(run_id, approve), timeout)
        except AssertionError as exc:
            raise CrashInvariantError(
                f"boundary {boundary}: run {run_id} never settled (still "
                f"{self._run(run_id)['status']})\ntimeline:\n{self.timeline(run_id)}"
                f"\n{self.output()}"
            ) from exc
        return self._invariants(boundary, run_id)

    def _invariants(self, boundary: Boundary, run_id: uuid.UUID) -> Outcome:
        run = self._run(run_id)
        effects = self._effects(run_id)
        problems: list[str] = []

        # A delivery whose key is no effect's (or that has none) did not come through the
        # outbox: it is counted by what it asked for, so that a read tool's side effect
        # repeated by a crash is a duplicate too. The keys of every run in the database are
        # the ledger's: a harness may drive several runs, each delivering under its own.
        with self._conn() as conn:
            rows = conn.execute("SELECT idempotency_key FROM ledgerloop.activity_effect")
            ledger_keys = {r["idempotency_key"] for r in rows.fetchall()}
        for call, count in self.downstream.duplicates(ledger_keys).items():
            problems.append(f"logical call {call} was performed {count} times downstream")
        performed = self.downstream.count_by_key()
        if run["status"] == "succeeded":
            for effect in effects:
                if effect["status"] == "succeeded" and performed[effect["idempotency_key"]] != 1:
                    problems.append(
                        f"effect {effect['idempotency_key']} succeeded in the ledger but was "
                        f"performed {performed[effect['idempotency_key']]} times downstream"
                    )
        unsettled = [e for e in effects if e["status"] not in SETTLED_EFFECTS]
        if unsettled and run["status"] in TERMINAL:
            problems.append(f"effects left without an owner: {unsettled}")

        answered: Counter[tuple[Any, ...]] = Counter(
            (r["conversation"], r["turn"], r["model"])
            for r in self.model.requests()
            if r.get("status") == 200
        )
        for turn, count in answered.items():
            if count > 1:
                problems.append(f"model turn {turn[1]} ({turn[2]}) was answered {count} times")

        timeline = self.timeline(run_id)
        if problems:
            raise CrashInvariantError(
                f"boundary {boundary}: " + "; ".join(problems) + f"\ntimeline of run {run_id}:\n"
                f"{timeline}"
            )
        return Outcome(boundary, run_id, run["status"], run["state"], effects, timeline)


@dataclass(frozen=True)
class Delivery:
    """What one delivery of a decision got: applied, duplicate (idempotent), or refused."""

    decision: str
    answer: str
    reason: str


class ApprovalEvents:
    """Approval decisions delivered the way the real world delivers them."""

    def __init__(self, harness: CrashHarness) -> None:
        self.harness = harness

    def twice(self, approval_id: uuid.UUID, decision: str) -> tuple[Delivery, Delivery]:
        """The same decision twice: the second must change nothing."""
        return self.harness.decide(approval_id, decision), self.harness.decide(
            approval_id, decision
        )

    def reversed(
        self, approval_id: uuid.UUID, first: str = "reject", then: str = "approve"
    ) -> tuple[Delivery, Delivery]:
        """Two conflicting decisions, the later one arriving last: it must be refused."""
        return self.harness.decide(approval_id, first), self.harness.decide(approval_id, then)

    def after_expiry(
        self, approval_id: uuid.UUID, decision: str = "approve", timeout: float = 60
    ) -> Delivery:
        """Wait until the approval has expired by the database's clock, then decide."""
        with self.harness._conn() as conn:

            def expired() -> bool:
                row = conn.execute(
                    "SELECT expires_at IS NOT NULL AND expires_at <= now() AS past"
                    " FROM ledgerloop.approval WHERE id = %s",
                    (approval_id,),
                ).fetchone()
                return bool(row and row["past"])

            wait_until(expired, timeout)
        return self.harness.decide(approval_id, decision)


def harness_env(
    *,
    agent_modules: Iterable[str],
    policy_file: Path,
    model_url: str,
    destinations: Mapping[str, str],
    pythonpath: Iterable[str] = (),
) -> dict[str, str]:
    """The worker and relay environment for a user's agent."""
    env = {
        "ANTHROPIC_BASE_URL": model_url,
        "LEDGERLOOP_AGENT_MODULES": ",".join(agent_modules),
        "LEDGERLOOP_POLICY_FILE": str(policy_file),
        "LEDGERLOOP_DESTINATIONS": json.dumps(dict(destinations)),
        # Settle quickly: a test waits for the reconciler, a person would not mind.
        "LEDGERLOOP_EFFECT_SETTLE_AFTER_S": "0.2",
        "LEDGERLOOP_RECONCILE_INTERVAL_S": "0.2",
        "LEDGERLOOP_RELAY_LEASE_MARGIN_S": "1",
    }
    paths = [str(p) for p in pythonpath]
    if paths:
        env["PYTHONPATH"] = ":".join(paths)
    return env
