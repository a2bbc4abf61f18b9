"""Step `tool-{i}-{call_id}` of a write and the durable wait for its outcome (`write_effect`,
one of the durable primitives: ledgerloop.agent.primitives), and what a settled effect leaves
the run: its tool result, and a compensation to remember."""

from __future__ import annotations

from typing import Any

from ledgerloop.agent import act_mcp, tracing, write_steps
from ledgerloop.agent.context import Approved, RunContext, Stop
from ledgerloop.agent.hibernation import wait_message
from ledgerloop.agent.stepping import CODE_STEP, run_step
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.faults import hit
from ledgerloop.runs.states import RunStatus
from ledgerloop.tools.registry import Tool


async def write_effect(
    run: RunContext, i: int, call: dict[str, Any], tool: Tool, approved: Approved | None
) -> dict[str, Any] | Stop:
    """Step `tool-{i}-{call_id}`: the effect and its outbox row in one commit (refused unless
    the approval row covers exactly this action), then a durable wait for its outcome.

    Messages wake; records decide: after every wake, step `outcome-{i}-{call_id}-{n}` reads
    the effect row; while the outcome is unknown the run waits in reconciling (one event per
    round). A succeeded effect with a compensating action is remembered in `run.compensable`.
    """
    call_id = str(call["id"])
    name = f"{run.scope}tool-{i}-{call_id}"
    recorded: dict[str, Any] = await run_step(
        name,
        CODE_STEP,
        write_steps.record_effect,
        run.run_id,
        run.tenant_id,
        name,
        run.agent.name,
        tool.name,
        call,
        approved.approval_id if approved else None,
        act_mcp.definition_for(run.mcp_tools, tool),
    )
    if "result" in recorded:
        result: dict[str, Any] = recorded["result"]
        return result
    run.status = RunStatus.EXECUTING.value
    hit("loop.after_effect_recorded")
    return await await_effect(run, i, call_id, tool, recorded)


async def await_effect(
    run: RunContext, i: int, call_id: str, tool: Tool, recorded: dict[str, Any]
) -> dict[str, Any] | Stop:
    """The tool result of a recorded effect, waiting durably while its outcome is open."""
    key: str = recorded["key"]
    if "outcome" in recorded:
        return _settled(run, call_id, tool, recorded)
    since: float | None = recorded.get("recorded_at")  # when the durable wait began
    wakes = rounds = 0
    previous: list[Any] | None = None
    while True:
        # A message says the effect may have changed; its row says what it is. A wake with no
        # message (the deadline, or someone else's message consumed) is judged the same way,
        # by the step's clock.
        await wait_message(key, run.deadline)
        was_replayed = tracing.wait_replayed()
        wakes += 1
        step = f"{run.scope}outcome-{i}-{call_id}-{wakes}"
        seen: dict[str, Any] = await run_step(
            step,
            CODE_STEP,
            write_steps.read_outcome,
            run.run_id,
            step,
            key,
            True,
            previous,
            rounds + 1,
        )
        tracing.waited(
            "effect",
            tool.name,
            since,
            was_replayed=was_replayed,
            idempotency_key=key,
            effect_status=seen["status"],
            error_type=write_steps.WAIT_ERRORS.get(seen["status"]),
        )
        since = None  # a later round's wait starts when the previous one ended
        if seen["status"] in write_steps.SETTLED:
            return _settled(run, call_id, tool, {**recorded, "outcome": seen["outcome"]})
        if seen["now"] >= run.deadline:
            return Stop(RunStatus.FAILED, "deadline_exceeded", {"waiting_for_effect": key})
        # pending or started (the message was not the relay's), outcome_unknown or
        # needs_human (reconciling): wait for the next change.
        previous = [seen["status"], seen["attempts"]]
        rounds += seen["round_recorded"]
        if seen["round_recorded"]:
            run.status = RunStatus.RECONCILING.value


def _settled(run: RunContext, call_id: str, tool: Tool, recorded: dict[str, Any]) -> dict[str, Any]:
    """The tool result of a succeeded or failed effect (`recorded["outcome"]`)."""
    remember_compensable(run, call_id, tool, recorded)
    return write_steps.settled_result(call_id, recorded["outcome"])


def remember_compensable(
    run: RunContext, call_id: str, tool: Tool, recorded: dict[str, Any]
) -> None:
    """Remember a succeeded effect that can be undone (`run.compensable`)."""
    outcome = recorded["outcome"]
    if outcome["status"] == EffectStatus.FAILED.value:
        return
    # Whether it can be undone was decided by the recording step (the policy's destination
    # may say so); a journal from before that records nothing and the code's word stands.
    compensable = recorded.get("compensable")
    if compensable is None:
        compensable = tool.effect is not None and bool(tool.effect.compensate_path)
    if compensable:
        run.compensable.append(
            {
                "call_id": call_id,
                "key": recorded["key"],
                "agent": run.agent.name,
                "tool": tool.name,
                "ref": outcome["external_reference"],
            }
        )
