"""Fork a finished run from one of its model calls: a new run whose journal up to that step
is the parent's, made by DBOS's `fork_workflow`.

The fork point is a think step (`think-N`, one model call): the fork asks the model again
from there, with everything before it (the conversation, approvals, tool results) taken
from the parent's journal as it is. The fork is a run of its own (its own id, row, history
and effects) whose state says `forked_from: {run_id, from_step, inherited_calls}`.

No effect the parent recorded is sent again. A step the fork runs again may record a write
that a call of the parent asked for (the plain writes of turn N-1 ride think-N): those calls
are listed in `inherited_calls` and keep the parent's idempotency key (effects.hashing), so
the ledger finds them recorded and answers with their outcome. Every call the fork's own
model makes gets a key of the fork's id: a write of its own, delivered once.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from dbos import SetWorkflowID, StepInfo
from psycopg.types.json import Jsonb

from ledgerloop.agent.stepping import QUEUE_NAME
from ledgerloop.db.connect import Conn, tenant_scope
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import Q, Run, run_create, run_require, run_transition

#: A model call of the run's own agent (a second agent's or a child episode's is scoped).
_THINK = re.compile(r"^think-(\d+)$")


class RunStillExecuting(LedgerloopError):
    """A run that has not finished cannot be forked: its journal is still growing."""

    status_code = 409


class ForkPointInvalid(LedgerloopError):
    """The step named is not one the run reached, or not a model call of its own agent."""

    status_code = 422


class Forker(Protocol):
    """What forking needs of `dbos.DBOSClient`."""

    def list_workflow_steps(
        self, workflow_id: str, *, load_output: bool = ..., limit: int | None = ...
    ) -> list[StepInfo]: ...

    def fork_workflow(
        self, workflow_id: str, start_step: int, *, queue_name: str | None = ...
    ) -> Any: ...


@dataclass(frozen=True)
class Forked:
    run: Run
    parent: Run


def fork_run(
    conn: Conn,
    run_id: uuid.UUID,
    *,
    from_step: int,
    workflows: Forker,
    tenant_id: uuid.UUID,
) -> Forked:
    """Fork run `run_id` (of `tenant_id`: another tenant's is not found) at think step
    `from_step` (its DBOS function id: the timeline's `detail.function_id`)."""
    with tenant_scope(conn, tenant_id):
        parent = run_require(conn, run_id)
    if parent.status not in TERMINAL:
        raise RunStillExecuting(
            f"run {run_id} is {parent.status.value}: only a finished run can be forked",
            fix="wait for it to finish, or cancel it first",
        )
    steps = workflows.list_workflow_steps(str(run_id), load_output=True)
    thinks = {s["function_id"]: s for s in steps if _THINK.match(s["function_name"])}
    reached = max((s["function_id"] for s in steps), default=0)
    if from_step not in thinks:
        if from_step > reached or from_step < 1:
            problem = f"run {run_id} never reached step {from_step} (its last is {reached})"
        else:
            name = next(s["function_name"] for s in steps if s["function_id"] == from_step)
            problem = f"step {from_step} of run {run_id} is {name!r}, not a model call"
        raise ForkPointInvalid(
            problem,
            fix="fork from a think step: "
            + (", ".join(f"{i} ({thinks[i]['function_name']})" for i in sorted(thinks)) or "none"),
        )
    inherited = dict((parent.state.get("forked_from") or {}).get("inherited_calls") or {})
    for function_id, step in thinks.items():
        if function_id < from_step:
            for call_id in _tool_calls(step["output"]):
                inherited.setdefault(call_id, str(run_id))
    fork_id = uuid.uuid4()
    link = {"run_id": str(run_id), "from_step": from_step, "inherited_calls": inherited}
    # The row and its link first: the workflow, once DBOS has it, may start at once and
    # reads the link to run as itself. Should the fork below fail, the row is left with no
    # workflow, and the sweeper settles it like any run whose workflow is missing.
    # It starts `planning`, as its parent was at least once the journal it takes was done
    # (memory-load moves a run there): the model call it makes next moves it on from there.
    with conn.transaction():
        run_create(
            conn,
            agent=parent.agent,
            input=parent.input,
            tenant_id=parent.tenant_id,
            run_id=fork_id,
        )
        conn.execute(Q["run_fork_link"], {"id": fork_id, "forked_from": Jsonb(link)})
        run_transition(
            conn,
            run_require(conn, fork_id),
            RunStatus.PLANNING,
            "forked",
            {"parent_run_id": str(run_id), "from_step": from_step},
        )
    with SetWorkflowID(str(fork_id)):
        workflows.fork_workflow(str(run_id), from_step, queue_name=QUEUE_NAME)
    conn.execute("SELECT pg_notify(%s, %s)", (QUEUE_NAME, str(fork_id)))  # wake a worker
    return Forked(run_require(conn, fork_id), parent)


def _tool_calls(output: Any) -> list[str]:
    """The tool call ids a think step's journaled model response asked for."""
    response = output.get("response") if isinstance(output, dict) else None
    content = response.get("content") if isinstance(response, dict) else None
    return [
        str(block["id"])
        for block in content or []
        if isinstance(block, dict) and block.get("type") == "tool_use" and "id" in block
    ]
