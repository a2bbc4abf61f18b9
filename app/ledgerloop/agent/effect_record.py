"""A write's record in one statement: the approval that allows it, the run's move to
executing, the effect and its outbox row (born claimed by this worker's relay), checked and
committed together in one round trip.

This is the record `write_steps` makes whenever this worker's relay delivers the effect: the
hot path of a write turn. A write a relay elsewhere delivers keeps the transaction of
`not_granted`, `run_ensure_status` and `effect_begin`. The rules are the same either way:

- nothing is written unless the approval, when the write has one, is approved by an
  authenticated principal for exactly this action, and was asked for this call of this run
  (and tenant): one approval allows one call (`not_granted` names what is missing);
- the run moves to executing from where `run_ensure_status` allows it, and the event is
  recorded once under the write's step name;
- the effect is recorded only when the run is there under that step (it moved now, or an
  earlier execution of the step moved it): a cancelled run gets no effect;
- a taken key returns the effect recorded under it when it is the same action (a repeated
  step), KeyReuse when it is not.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from ledgerloop.approvals.records import Approval, ApprovalStatus
from ledgerloop.approvals.store import approval_get
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.ledger import Claim, Effect, effect_insert_params, effect_inserted
from ledgerloop.effects.outbox import Deliverer, Outcome
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import RunNotFound, moves_to, run_not_moved

Q = load_queries("ledgerloop.agent")

_EXECUTING_FROM = moves_to(RunStatus.EXECUTING)


class NotGranted(LedgerloopError):
    """The write's approval does not allow it; `problem` says why."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def not_granted(
    approval: Approval | None,
    action_hash: str,
    *,
    run_id: uuid.UUID | str,
    tool_call_id: str,
    tenant_id: uuid.UUID | str,
) -> str | None:
    """Why `approval` does not let call `tool_call_id` of run `run_id` (of `tenant_id`) run
    `action_hash`, or None when it does.

    An approval allows the one call it was asked for: the hash alone says what the action
    is, not who takes it, and another call (or run) with the same arguments needs its own
    approval. The effect-record statement checks the same (migration 0025)."""
    if approval is None:
        return "the approval does not exist"
    asked_for = (str(approval.run_id), approval.tool_call_id)
    if asked_for != (str(run_id), tool_call_id):
        return (
            f"approval {approval.id} was granted for run {approval.run_id} call "
            f"{approval.tool_call_id}, not run {run_id} call {tool_call_id}"
        )
    if str(approval.tenant_id) != str(tenant_id):
        return (
            f"approval {approval.id} was granted for tenant {approval.tenant_id}, "
            f"not tenant {tenant_id}"
        )
    if approval.status is not ApprovalStatus.APPROVED:
        return f"approval {approval.id} is {approval.status.value}, not approved"
    if approval.decided_by_principal is None or approval.auth_role is None:
        return f"approval {approval.id} has no authenticated decider"
    if approval.action_hash != action_hash:
        return f"approval {approval.id} covers the action {approval.action_hash}, not {action_hash}"
    return None


def born_rewound(row: dict[str, Any]) -> bool:
    """Whether an effect row was recorded for a run whose recent past a failover lost
    (migration 0027): born `started` with its lease run out, for the reconciler to find
    again by its key, never sent as a new write."""
    evidence = row.get("evidence")
    return isinstance(evidence, dict) and "rewound" in evidence


#: The write's one statement; its parameters are `claimed_record_params`'s.
RECORD_CLAIMED = Q["effect_record_claimed"]


def claimed_record_params(
    lease_margin_s: float,
    *,
    step: str,
    payload: dict[str, Any],
    approval_id: uuid.UUID | None = None,
    **facts: Any,
) -> dict[str, Any]:
    """`RECORD_CLAIMED`'s parameters: `effect_begin`'s facts, the run's event under `step`
    with `payload`, the approval that allows the write (None: none needed), and the relay's
    lease margin for the row born claimed."""
    return {
        **effect_insert_params({**facts, "compensates": None}, lease_margin_s),
        "approval_id": approval_id,
        "step": step,
        "payload": Jsonb(payload),
        "allowed_from": _EXECUTING_FROM,
    }


async def record_claimed_write(
    deliverer: Deliverer,
    pool: ConnectionPool[Conn],
    *,
    step: str,
    payload: dict[str, Any],
    tool_call_id: str,
    approval_id: uuid.UUID | None = None,
    **facts: Any,
) -> tuple[Effect, Claim | None]:
    """Move the run to executing (its event under `step`, with `payload`) and record the
    effect of call `tool_call_id` claimed for `deliverer` (`effect_begin`'s facts), in one
    autocommit statement on a connection of the deliverer's (`Deliverer.records`), only if
    `approval_id` (when given) allows it. `pool` serves the rare answers that read more.

    Raises NotGranted when the approval does not allow the write; what `run_ensure_status`
    raises when the run cannot move (RunStopped, InvalidTransition, RunNotFound); KeyReuse
    when the key holds another action. Nothing is written then. A taken key with the same
    action returns the recorded effect, unclaimed: whoever holds its claim delivers it.
    """
    query = claimed_record_params(
        deliverer.lease_margin_s, step=step, payload=payload, approval_id=approval_id, **facts
    )
    run_id: uuid.UUID = facts["run_id"]
    # On the deliverer's own connection, on this loop: the delivery follows at once.
    async with deliverer.records() as aconn:
        cursor = await aconn.execute(RECORD_CLAIMED, query)
        row = await cursor.fetchone()
    if row is None:
        raise RunNotFound(f"no run {run_id}", fix="check the run id")
    if row["idempotency_key"] is not None:
        if born_rewound(row):
            # Maybe delivered already, under a record a failover lost: the reconciler finds
            # it by its key; this worker does not send it.
            return Effect.from_row(row), None
        return Effect.from_row(row), Claim(row["outbox_id"], row["deadline_in_s"])

    def rare() -> tuple[Effect, Claim | None]:
        # The rare answers (nothing was written) read more, from a thread of the pool.
        with pool.connection() as conn:
            if not row["granted"]:
                assert approval_id is not None
                approval = approval_get(conn, approval_id)
                problem = not_granted(
                    approval,
                    facts["request_hash"],
                    run_id=run_id,
                    tool_call_id=tool_call_id,
                    tenant_id=facts["tenant_id"],
                )
                # Approved since the statement looked: judged as the statement saw it.
                raise NotGranted(problem or f"approval {approval_id} was not approved yet")
            if not row["there"]:
                current = RunStatus(row["current"])
                run_not_moved(conn, run_id, current, RunStatus.EXECUTING)
            return effect_inserted(conn, None, facts)

    return await asyncio.to_thread(rare)


# -- a write recorded ahead, with the checkpoint of the step that decided it (write_ahead) --


#: What the relay's `send_now` answers.
Sent = tuple[Outcome, asyncio.Future[bool]] | None


class Sending:
    """The relay's `send_now` of a write recorded ahead, started on the relay's loop by the
    thread that committed the write (`start`, through `call_soon_threadsafe`).

    The step that takes the write awaits the task itself, on that loop: a thread-safe
    future would cost a wake of the loop and two more rounds of its callbacks between the
    downstream's answer and the step (0.2-0.5 ms of a write turn, `turn_write_timeline`).
    The loop runs `start` before it resumes the workflow whose checkpoint committed the
    write (one thread's `call_soon_threadsafe` callbacks run in the order they were made,
    and the checkpoint's own completion is one made after), so `task` is there by then."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Sent] | None = None

    def start(self, send: Coroutine[Any, Any, Sent]) -> None:
        self.task = asyncio.get_running_loop().create_task(send)

    async def result(self) -> Sent:
        while self.task is None:  # the loop has not started it yet (see above: not seen)
            await asyncio.sleep(0)
        if self.task.done():  # mostly: the POST ran while DBOS changed steps
            return self.task.result()
        # Not shielded: a shield's extra round of callbacks would let the relay's recorder
        # (woken as the send ends) run before this step. A step cancelled meanwhile cancels
        # the send, as a cancelled thread-safe future did: its effect stays claimed and
        # settles after its lease.
        return await self.task


@dataclass(frozen=True)
class Prerecorded:
    """A write committed with the checkpoint of the think step whose answer asked for it,
    born claimed by this worker's relay, waiting in memory for the step that sends it."""

    effect: Effect
    claim: Claim
    #: The delivery as its outbox row holds it.
    request: dict[str, Any]
    #: (trace id, span id) of the tool span its delivery names as parent, when recording.
    span: tuple[int, int] | None
    #: time.monotonic() at the commit.
    at: float
    #: Seconds from the commit until the row's lease runs out (the reconciler's then).
    lease_s: float
    #: The relay's `send_now` of it, started at the commit.
    sending: Sending
    #: The policy version its request was hashed under (the step sending it checks it is
    #: still this one rather than hashing the request again).
    policy_version: str
    #: The step the record of its outcome moves the run back to planning under, if any.
    replan_step: str | None = None


_prerecorded: dict[str, Prerecorded] = {}
_prerecorded_lock = threading.Lock()
#: An entry nobody took (the run was cancelled between its steps, the worker stops) is
#: dropped after this; its effect settles as any unsent claimed row does, after its lease.
_KEEP_S = 600.0


def hand_over(written: Prerecorded) -> None:
    """Keep a prerecorded write for the step that sends it (`take_prerecorded`)."""
    with _prerecorded_lock:
        _prerecorded[written.effect.key] = written
        stale = [k for k, w in _prerecorded.items() if written.at - w.at > _KEEP_S]
        for key in stale:
            del _prerecorded[key]


def forget_runs(run_ids: set[str]) -> int:
    """Drop the writes recorded ahead for `run_ids` (the database lost them with a failover:
    the step that records the write again hands over a new one). How many were dropped."""
    with _prerecorded_lock:
        gone = [k for k, w in _prerecorded.items() if str(w.effect.run_id) in run_ids]
        for key in gone:
            del _prerecorded[key]
    return len(gone)


def take_prerecorded(key: str) -> Prerecorded | None:
    """The write recorded ahead under `key` by this process, once; None when there is none,
    or when its claim is too old to deliver under (half its lease gone: a relay elsewhere
    may take it then). Its claim's deadline counts from the commit."""
    with _prerecorded_lock:
        written = _prerecorded.pop(key, None)
    if written is None:
        return None
    age = time.monotonic() - written.at
    if age > written.lease_s / 2:
        return None
    claim = replace(written.claim, deadline_in_s=written.claim.deadline_in_s - age)
    return replace(written, claim=claim)
