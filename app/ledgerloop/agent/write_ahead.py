"""A plain write recorded with the checkpoint of the think step whose answer asked for it.

A turn of read tools and plain writes (agent.turn_tools) runs inside the next think step,
and each write is recorded there before it is sent: one statement and its durable commit,
the one part of a write turn a read turn does not pay. When this worker's relay delivers,
a write that opens the turn is instead recorded by the think step that got the answer: its
statement (agent.effect_record's, unchanged: approval, the run's move to executing under
the write's step name, the effect and its outbox row born claimed) rides that step's DBOS
checkpoint (db.dbos_checkpoint), so the decision and the effect commit together, in one
transaction, and the write turn has no commit of its own before the POST. The effect is
handed to the next step in memory (`effect_record.take_prerecorded`), which sends it at once.

What does not change:
- the write is recorded only if the journal holds the answer that asked for it (the same
  commit), and only once: its key is the run's and the call's, as before;
- a repeat of the next step (the worker died before its checkpoint) finds the effect by its
  key and waits for its outcome durably, as after a crash once the record committed; the
  claim of a worker that died settles after its lease, as any claimed row does;
- nothing is recorded ahead unless the next step is certain to send it first thing: the
  loop allows it (`Ride`), every call of the answer may ride a think step (`plain_calls`),
  the write is the answer's first call, the answer came before the run's deadline, and
  this worker's relay delivers here;
- nor unless a crash between the two steps settles without a person: the destination
  honours the idempotency key or can look the effect up (`_settles_alone`). A write to one
  that does neither is recorded in the next step, right before it is sent, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dbos import DBOS
from pydantic import ValidationError

from ledgerloop.agent import write_steps
from ledgerloop.agent.definition import Agent, get_agent
from ledgerloop.agent.effect_record import (
    RECORD_CLAIMED,
    Prerecorded,
    Sending,
    born_rewound,
    claimed_record_params,
    hand_over,
)
from ledgerloop.db import dbos_checkpoint
from ledgerloop.effects.hashing import idempotency_key
from ledgerloop.effects.ledger import Claim, Effect
from ledgerloop.effects.outbox import Claimed, Deliverer
from ledgerloop.faults import hit
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry.runtrace import planned_span
from ledgerloop.tools.registry import HttpEffect, Tool, ToolKind

log = logging.getLogger(__name__)

Body = Callable[..., Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Ride:
    """What the loop tells a think step about the turn after it: its calls will ride the
    next think step if `plain_calls` says they may."""

    #: The prefix of the turn's write step names (`{scope}tool-{i}-`).
    tool_step: str
    tenant_id: str
    #: The run's deadline: an answer after it ends the run instead (the loop's check).
    deadline: float
    #: The names of the run's MCP tools (never plain writes).
    mcp_names: frozenset[str]
    #: The think step the turn rides (`think-{i+1}`).
    next_step: str
    #: Whether that step moves the run back to planning once the writes settled (the run's
    #: own agent; a scoped one does not): the record of its last write's outcome does it.
    moves: bool


def plain_calls(agent: Agent, mcp_names: frozenset[str], calls: list[dict[str, Any]]) -> bool:
    """Whether each call is a read tool of the agent's own (or a name it does not know),
    or a plain write: an HTTP write tool of its own for which the policy can never ask a
    person. MCP tools, sandboxed commands and writes that may need an approval keep steps
    of their own."""
    policy = get_runtime().policy
    for call in calls:
        name = str(call.get("name"))
        if name in mcp_names:
            return False
        tool = agent.tool(name)
        if tool is None or tool.kind is ToolKind.READ:
            continue
        if tool.kind is not ToolKind.WRITE or not isinstance(tool.effect, HttpEffect):
            return False
        if policy.for_write_tool(name).may_require_approval:
            return False
    return True


def recording_ahead(body: Body, ride: Ride) -> Body:
    """`body` (a think step's), then, when its answer's first write may be recorded ahead,
    that record made to ride the step's checkpoint."""

    async def think(run_id: str, step_name: str, agent_name: str, *args: Any) -> dict[str, Any]:
        result = await body(run_id, step_name, agent_name, *args)
        try:
            _offer(run_id, agent_name, ride, result)
        except Exception:
            # Only a shortcut: the next step records the write itself, as it would have.
            log.warning("run %s: the write was not recorded ahead", run_id, exc_info=True)
        return result

    return think


def _offer(run_id: str, agent_name: str, ride: Ride, result: dict[str, Any]) -> None:
    if "response" not in result or "pending" in result or "saved" in result:
        return
    if result["now"] > ride.deadline or not dbos_checkpoint.installed():
        return
    calls = [b for b in result["response"].get("content") or () if b.get("type") == "tool_use"]
    agent = get_agent(agent_name)
    if not calls or agent is None or not plain_calls(agent, ride.mcp_names, calls):
        return
    first = calls[0]
    tool = agent.tool(str(first.get("name")))
    if tool is None or tool.kind is not ToolKind.WRITE:
        return
    assert isinstance(tool.effect, HttpEffect)  # plain_calls said so
    deliverer = write_steps.local_deliverer()
    if deliverer is None or not _settles_alone(tool):
        return
    rt = get_runtime()
    try:
        body, action_hash, args = write_steps.write_action(tool, first)
    except ValidationError:
        return  # the next step answers the model with the error
    policy = rt.policy.for_write_tool(tool.name)
    if policy.approval_needed(args.model_dump(mode="json"))[0]:
        return  # the next step refuses it
    call_id = str(first["id"])
    key = idempotency_key(run_id, call_id)
    # As turn_tools decides it: the last write's outcome record moves the run back.
    writes = [str(c["id"]) for c in calls if _is_write(agent, c)]
    last = ride.moves and writes[-1] == call_id
    planned = planned_span()
    delivery = write_steps.delivery_request(tool, body, policy, planned[0] if planned else None)
    facts: dict[str, Any] = {
        "key": key,
        "run_id": uuid.UUID(run_id),
        "tenant_id": uuid.UUID(ride.tenant_id),
        "tool": tool.name,
        "request_hash": action_hash,
        "destination": tool.effect.destination,
        "request": delivery,
    }
    params = claimed_record_params(
        deliverer.lease_margin_s,
        step=f"{ride.tool_step}{call_id}",
        payload={"tool_call_id": call_id, "idempotency_key": key},
        **facts,
    )
    lease_s = delivery.timeout_ms / 1000 + deliverer.lease_margin_s
    rider = _Record(
        params,
        delivery.to_json(),
        planned[1] if planned else None,
        lease_s,
        sender=(deliverer, asyncio.get_running_loop()),
        replan_step=ride.next_step if last else None,
        policy_version=rt.policy.version,
    )
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    assert workflow_id is not None
    assert step_id is not None
    dbos_checkpoint.ride(workflow_id, step_id, rider)


def _is_write(agent: Agent, call: dict[str, Any]) -> bool:
    tool = agent.tool(str(call.get("name")))
    return tool is not None and tool.kind is ToolKind.WRITE


def _settles_alone(tool: Tool) -> bool:
    """Whether an effect of `tool` recorded and never sent (its worker died in between) is
    settled by the reconciler without a person: resent under its key, or looked up. Only
    those are recorded ahead: the step boundary is a longer window than a step's own."""
    facts = write_steps.effect_facts(tool)
    return facts.honours_idempotency or facts.lookup_path is not None


class _Record:
    """The write's one statement, riding a checkpoint (db.dbos_checkpoint.Rider)."""

    query = RECORD_CLAIMED

    def __init__(
        self,
        params: dict[str, Any],
        request: dict[str, Any],
        span: tuple[int, int] | None,
        lease_s: float,
        *,
        sender: tuple[Deliverer, asyncio.AbstractEventLoop],
        replan_step: str | None,
        policy_version: str,
    ) -> None:
        self.params = params
        self.request = request
        self.span = span
        self.lease_s = lease_s
        self.sender = sender
        self.replan_step = replan_step
        self.policy_version = policy_version

    def committed(self, row: dict[str, Any]) -> None:
        if row["idempotency_key"] is None:
            # Nothing written (the run was not there, the key was taken): the next step
            # records, or finds, the write itself and says why.
            return
        if born_rewound(row):
            # Recorded again after a failover lost its first record: the reconciler finds it
            # by its key; the next step finds the write recorded and waits for its outcome.
            return
        effect = Effect.from_row(row)
        claim = Claim(row["outbox_id"], row["deadline_in_s"])
        # Where a crash test kills the worker between the commit and the send.
        hit("write_ahead.before_send")
        # The write is durable: the relay sends it now, while DBOS ends this step and starts
        # the next, which takes the send under way (`Prerecorded.sending`).
        deliverer, loop = self.sender
        claimed = Claimed.at_insert(effect, claim, self.request, self.replan_step)
        sending = Sending()
        send = deliverer.send_now(claimed)
        try:
            loop.call_soon_threadsafe(sending.start, send)
        except RuntimeError:  # the loop is closed: the worker stops; the lease settles it
            send.close()
            log.warning("the write %s was not sent: the worker stops", effect.key)
            return
        hand_over(
            Prerecorded(
                effect=effect,
                claim=claim,
                request=self.request,
                span=self.span,
                at=time.monotonic(),
                lease_s=self.lease_s,
                sending=sending,
                policy_version=self.policy_version,
                replan_step=self.replan_step,
            )
        )
