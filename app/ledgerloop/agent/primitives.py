"""Durable primitives: the steps of an agent run, callable from any Ledgerloop workflow.

    memory_load(run_id)                  memory-load
    think(run, i, reads=turn)            think-{i}  [think-{i}-settled] [think-{i}-strong]
    call_read_tool(run, i, call)         tool-{i}-{call_id}
    wait_for_approval(run, i, call, t)   approve-{i}-{call_id}   + durable wait for the decision
    write_effect(run, i, call, t, ok)    tool-{i}-{call_id}      + durable wait for the outcome
    act(run, i, call)                    call_read_tool, or wait_for_approval (when the policy
                                         asks) then write_effect
    wait_for_message(run, timeout)       message-wait-{n}  + durable wait for a message
    remember(run, messages)              (no step: the journal holds them until a save)
    memory_save(run, i, messages, ...)   memory-save-{i}
    finish(run, status, reason)          compensate-{call_id}...  finish

The built-in loop (`ledgerloop.agent.loop`) is these calls in a `for` loop; a custom
orchestration calls the same ones and gets the same step names, the same journal and the same
guarantees: a model call is never paid twice, an effect is recorded once with its idempotency
key and delivered through the outbox, and what runs is exactly what was approved.

All of them are workflow code: call them from a DBOS workflow, never from a step. They are
deterministic given the journal, so the code between them must be too (time comes from
`run.now`, which only step results move). The state of the run lives in one `RunContext`
that the caller passes to every call, never in hidden globals.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from dbos import DBOS

from ledgerloop.agent import (
    act_mcp,
    compensation_steps,
    steps,
    tracing,
    turn_tools,
    write_ahead,
    write_steps,
)
from ledgerloop.agent.act_sandbox import act_sandbox, destroy_sandboxes
from ledgerloop.agent.approval_wait import wait_for_approval as wait_for_approval
from ledgerloop.agent.budgets import RunBudget, RunBudgetExceeded
from ledgerloop.agent.context import Approved, Ended, Message, RunContext, Stop, Thought
from ledgerloop.agent.definition import get_agent
from ledgerloop.agent.effect_wait import await_effect, remember_compensable
from ledgerloop.agent.effect_wait import write_effect as write_effect
from ledgerloop.agent.messages import Received as Received
from ledgerloop.agent.messages import wait_for_message as wait_for_message
from ledgerloop.agent.stepping import CODE_STEP, MODEL_STEP, run_step
from ledgerloop.agent.steps import is_empty_turn
from ledgerloop.agent.write_ahead import Ride
from ledgerloop.failures import NONDETERMINISM, describe, error_name
from ledgerloop.faults import hit
from ledgerloop.models.client import Tier
from ledgerloop.runs.states import RunStatus
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry.executions import count_tokens
from ledgerloop.tools.registry import Tool, ToolKind

# wait_for_approval and write_effect, primitives too, live in approval_wait and effect_wait
# (for their size) and are re-exported above.

log = logging.getLogger(__name__)


# -- memory ------------------------------------------------------------------------------


async def memory_load(run_id: str, trace: dict[str, Any] | None = None) -> RunContext | Ended:
    """Step `memory-load`: read the run and its conversation, move it to planning."""
    ctx: dict[str, Any] = await run_step(
        "memory-load", CODE_STEP, steps.memory_load, run_id, trace or {}
    )
    if "terminal" in ctx:
        return Ended(ctx["terminal"])
    agent = get_agent(ctx["agent"])
    assert agent is not None  # memory-load failed the run otherwise
    messages: list[Message] = ctx["messages"]
    run = RunContext(
        run_id=run_id,
        agent=agent,
        tenant_id=ctx["tenant_id"],
        conversation_id=ctx["conversation_id"],
        deadline=ctx["deadline"],
        now=ctx["now"],
        messages=messages,
        # The new user message is saved with the first turn; history by earlier runs.
        unsaved=messages[ctx["history_len"] :],
        trace=ctx.get("trace") or {},
        created_ns=ctx.get("created_ns"),
        reads_in_think=bool(ctx.get("reads_in_think")),
        writes_in_think=bool(ctx.get("writes_in_think")),
        # A run whose memory-load journaled no budget began before there was one: it keeps
        # the rules it began with (the built-in loop's iteration cap only).
        budget=RunBudget.from_json(ctx.get("budget")),
    )
    if agent.mcp_servers:
        await discover_mcp(run)
    return run


def remember(run: RunContext, new_messages: list[Message]) -> None:
    """Add a turn's messages to the conversation without a step of their own.

    A tool turn's messages are already in the journal (the think step's answer, the tool
    steps' results), so a replay rebuilds them; they reach conversation memory with the run's
    next save (memory_save, or finish). This keeps a read-tool turn at two durable commits.
    """
    run.messages.extend(new_messages)
    run.unsaved.extend(new_messages)


async def memory_save(
    run: RunContext,
    i: int,
    new_messages: list[Message],
    target: RunStatus,
    event: str,
    payload: dict[str, Any],
) -> dict[str, Any]:
    """Step `memory-save-{i}`: the turn's messages and the run's next status, in one commit."""
    if target is RunStatus.SUCCEEDED and run.sandboxes:
        await destroy_sandboxes(run)
    batch = [*run.unsaved, *new_messages]
    state = {"turn": i, **payload} if target is RunStatus.SUCCEEDED else {"turn": i}
    saved: dict[str, Any] = await run_step(
        f"{run.scope}memory-save-{i}",
        CODE_STEP,
        steps.memory_save,
        run.run_id,
        run.tenant_id,
        run.conversation_id,
        i,
        run.saved,
        batch,
        target.value,
        event,
        payload,
        state,
    )
    run.messages.extend(new_messages)
    run.saved += len(batch)
    run.unsaved = []
    run.now = saved["now"]
    run.status = target.value
    return saved


async def discover_mcp(run: RunContext) -> None:
    """Step `mcp-discover`: the tools of the agent's MCP servers, listed once per run (the
    journaled list is what every later execution of the run sees)."""
    listed: dict[str, Any] = await run_step(
        f"{run.scope}mcp-discover", CODE_STEP, act_mcp.discover, run.agent.name
    )
    run.mcp_tools = act_mcp.register_discovered(listed["tools"])
    run.mcp_schemas = [act_mcp.schema_of(d) for d in run.mcp_tools.values()]


# -- think -------------------------------------------------------------------------------


async def think(
    run: RunContext,
    i: int,
    tier: Tier | None = None,
    *,
    save_answer: bool = False,
    empty_turns_before: int = 0,
    reads: Message | None = None,
    ride: Ride | None = None,
) -> Thought:
    """Step `think-{i}`: one model call. An empty turn is asked once more of the strong tier
    (step `think-{i}-strong`): the same tier would answer nothing again.

    `reads`: the previous turn's assistant message, when its calls may ride this step (see
    `rides_think`): they run in this step before the model call, and the turn (the message
    and its tool results) joins the conversation as `remember` would add it. A write that
    does not settle at once ends the step before its model call: the run waits for it
    durably, runs the turn's remaining calls as steps, and calls the model in step
    `think-{i}-settled` (`Thought.stop` when the wait ends the run).

    `save_answer`: an answer nothing may refuse (no answer validator, no sandbox) ends the
    run as succeeded in the same step (steps.save_answer, recorded as `memory-save-{i}`, its
    empty turns counted from `empty_turns_before`); `Thought.saved` then says so. An older
    journal without that save answers without it, and the caller saves as before.

    `ride`: the caller will run the answer's calls in the next think step when they may
    (`next_ride`): its first plain write is then recorded with this step's checkpoint
    (agent.write_ahead).

    Each call is a turn of the run's budgets (`run.budget`): with none left it raises
    RunBudgetExceeded before anything is asked, and every model call's tokens count."""
    spent_out = run.budget.exhausted(run.spent)
    if spent_out is not None:
        raise run.budget.exceeded(spent_out, run.spent)
    run.spent.turns += 1
    save = save_answer and not run.scope and not run.sandboxes and not run.agent.validate_answer
    before = empty_turns_before
    result = await _think(
        run, i, tier or Tier(run.agent.tier), save=save, empty=before, reads=reads, ride=ride
    )
    if reads is not None:
        for written in result.get("writes", ()):
            tool = _write_tool(run, written["tool"])
            remember_compensable(run, written["call_id"], tool, written["recorded"])
        results = result["reads"]
        if "pending" in result:
            rest = await _settle_turn(run, i - 1, reads, result)
            if isinstance(rest, Stop):
                return Thought([], stop=rest)
            results = rest
        elif result.get("writes"):
            # The writes moved the run to executing; the run's own agent moved it back.
            run.status = (RunStatus.EXECUTING if run.scope else RunStatus.PLANNING).value
        remember(run, [reads, {"role": "user", "content": results}])
        hit("loop.after_tools")
        if "pending" in result:
            tier = tier or Tier(run.agent.tier)
            result = await _think(
                run, i, tier, suffix="-settled", save=save, empty=before, ride=ride
            )
    empty_turns = 0
    if "response" in result and is_empty_turn(result["response"]):
        empty_turns = 1
        if result["tier"] != Tier.STRONG.value:
            strong = Tier.STRONG
            result = await _think(
                run, i, strong, suffix="-strong", save=save, empty=before + 1, ride=ride
            )
    hit("loop.after_think")
    run.now = result["now"]
    if "error" in result:
        return Thought([], error=result["error"], empty_turns=empty_turns)
    # Only the content is kept: a run may wait hours for an approval next, and thousands of
    # waiting runs should not each hold a whole response.
    content: list[dict[str, Any]] = result["response"]["content"]
    thought = Thought(content, empty=is_empty_turn(result["response"]), empty_turns=empty_turns)
    if "saved" in result:
        run.saved += len(run.unsaved) + 1
        run.unsaved = []
        run.messages.append(thought.message())
        run.status = result["saved"]
        return replace(thought, saved=True)
    return thought


async def _think(
    run: RunContext,
    i: int,
    tier: Tier,
    suffix: str = "",
    *,
    save: bool = False,
    empty: int = 0,
    reads: Message | None = None,
    ride: Ride | None = None,
) -> dict[str, Any]:
    name = f"{run.scope}think-{i}{suffix}"
    # Counted before the step: a step that ends the run reports the run's counts itself.
    tracing.count_call("inference")
    # Only the run's own agent moves the run (a scoped agent shares the run's status).
    replan = run.status != RunStatus.PLANNING.value and not run.scope
    # Journaled arguments stay as they were for a run without either (replays compare names,
    # not arguments, but a shorter argument list is a smaller journal row).
    extra: list[Any] = []
    if run.mcp_schemas or replan or save or reads:
        extra = [run.mcp_schemas or None]
    if replan or save or reads:
        extra.append(replan)
    if save:
        memory = {"conversation_id": run.conversation_id, "first_sequence": run.saved}
        extra.append({"turn": i, "empty_turns": empty, "unsaved": run.unsaved, **memory})
    elif reads:
        extra.append(None)
    body: Any = steps.think
    if reads:
        turn: dict[str, Any] = {"message": reads, "tenant_id": run.tenant_id}
        writes = _write_calls(run, reads)
        if writes:
            body = turn_tools.think_after_tools
            # Only the run's own agent moves the run back to planning (as `replan` says).
            turn.update(writes=writes, tool_step=f"{run.scope}tool-{i - 1}-", moves=not run.scope)
        extra.append(turn)
    if ride is not None:
        body = write_ahead.recording_ahead(body, ride)
    result: dict[str, Any] = await run_step(
        name,
        MODEL_STEP,
        body,
        run.run_id,
        name,
        run.agent.name,
        tier.value,
        run.messages,
        *extra,
    )
    if "response" in result:
        run.spent.add_usage(result["response"].get("usage"))
        count_tokens(result["response"].get("usage"))  # the run's totals, for its root span
    if "pending" in result:
        # It ended at a pending write and asked the model nothing (its `-settled` step does).
        tracing.count_call("inference", -1)
    elif replan:
        run.status = RunStatus.PLANNING.value
    return result


# -- act ---------------------------------------------------------------------------------


def only_reads(run: RunContext, calls: list[dict[str, Any]]) -> bool:
    """Whether a turn's calls may run inside the next think step (`think(..., reads=)`):
    each one a read tool of the agent's own, or a name it does not know (which answers with
    an error result); none an MCP tool, a sandboxed command or a write, whose steps hold
    more than a call that may safely be made again."""
    for call in calls:
        name = str(call.get("name"))
        if name in run.mcp_tools:
            return False
        tool = run.agent.tool(name)
        if tool is not None and tool.kind is not ToolKind.READ:
            return False
    return True


def rides_think(run: RunContext, calls: list[dict[str, Any]]) -> bool:
    """Whether a turn's calls may run inside the next think step (`think(..., reads=)`):
    reads (`only_reads`) for a run whose journal allows it, and, for a run that began under
    this loop, also plain writes: the agent's own HTTP write tools for which the policy can
    never ask a person (`turn_tools`). An approval, an MCP tool or a sandboxed command keeps
    a step of its own."""
    if not run.reads_in_think:
        return False
    if only_reads(run, calls):
        return True
    if not run.writes_in_think:
        return False
    return write_ahead.plain_calls(run.agent, frozenset(run.mcp_tools), calls)


def next_ride(run: RunContext, i: int, max_turns: int) -> Ride | None:
    """What think step `i` is told of the turn after it (`think(ride=)`): its calls may ride
    think step `i + 1` (there is one, and the run's journal allows writes there)."""
    if i + 1 >= max_turns or not (run.reads_in_think and run.writes_in_think):
        return None
    return Ride(
        tool_step=f"{run.scope}tool-{i}-",
        tenant_id=run.tenant_id,
        deadline=run.deadline,
        mcp_names=frozenset(run.mcp_tools),
        next_step=f"{run.scope}think-{i + 1}",
        moves=not run.scope,
    )


def _write_calls(run: RunContext, message: Message) -> dict[str, str]:
    """{call id: tool name} for the write calls of a turn that rides a think step."""
    writes = {}
    for call in message["content"]:
        if call.get("type") != "tool_use" or str(call.get("name")) in run.mcp_tools:
            continue
        tool = run.agent.tool(str(call.get("name")))
        if tool is not None and tool.kind is ToolKind.WRITE:
            writes[str(call["id"])] = tool.name
    return writes


def _write_tool(run: RunContext, name: str) -> Tool:
    tool = run.agent.tool(name)
    if tool is None:  # the journal names it: the agent's code lost the tool since
        raise LookupError(f"agent {run.agent.name} has no write tool {name} any more")
    return tool


async def _settle_turn(
    run: RunContext, i: int, message: Message, result: dict[str, Any]
) -> list[dict[str, Any]] | Stop:
    """The rest of turn `i` after its think step ended at a write that did not settle: the
    durable wait for that write, then the turn's remaining calls as steps of their own."""
    pending = result["pending"]
    call_id = str(pending["call_id"])
    run.status = RunStatus.EXECUTING.value  # the write's record moved it
    run.now = result["now"]
    tool = _write_tool(run, pending["tool"])
    settled = await await_effect(run, i, call_id, tool, pending["recorded"])
    if isinstance(settled, Stop):
        return settled
    results = [*result["reads"], settled]
    calls = [c for c in message["content"] if c.get("type") == "tool_use"]
    after = [c["id"] for c in calls].index(call_id) + 1
    for call in calls[after:]:
        outcome = await _act(run, i, call)  # counted by the loop when the turn rode think
        if isinstance(outcome, Stop):
            return outcome
        results.append(outcome)
    return results


async def act(run: RunContext, i: int, call: dict[str, Any]) -> dict[str, Any] | Stop:
    """Run one tool call of turn `i`: its tool result for the model, or a Stop."""
    tracing.count_call("tool")
    return await _act(run, i, call)


async def _act(run: RunContext, i: int, call: dict[str, Any]) -> dict[str, Any] | Stop:
    definition = run.mcp_tools.get(str(call.get("name")))
    if definition is not None and definition["kind"] != ToolKind.WRITE.value:
        return await _mcp_read(run, i, call, definition)
    tool = act_mcp.as_tool(definition) if definition else run.agent.tool(str(call.get("name")))
    if tool is not None and tool.kind is ToolKind.SANDBOX:
        return await act_sandbox(run, i, call, tool)
    if tool is None or tool.kind is not ToolKind.WRITE:
        return await call_read_tool(run, i, call)
    approved: Approved | None = None
    if get_runtime().policy.for_write_tool(tool.name).may_require_approval:
        decision = await wait_for_approval(run, i, call, tool)
        if not isinstance(decision, Approved):
            return decision
        approved = decision
        hit("loop.after_approval")
    return await write_effect(run, i, call, tool, approved)


async def _mcp_read(
    run: RunContext, i: int, call: dict[str, Any], definition: dict[str, Any]
) -> dict[str, Any]:
    name = f"{run.scope}tool-{i}-{call['id']}"
    result: dict[str, Any] = await run_step(
        name, CODE_STEP, act_mcp.run_mcp_read, run.run_id, run.tenant_id, name, definition, call
    )
    return result


async def call_read_tool(run: RunContext, i: int, call: dict[str, Any]) -> dict[str, Any]:
    """Step `tool-{i}-{call_id}`: a read tool, inline, with the policy's timeout and retries.
    An unknown tool or bad arguments come back as an error tool result for the model."""
    name = f"{run.scope}tool-{i}-{call['id']}"
    result: dict[str, Any] = await run_step(
        name, CODE_STEP, steps.run_read_tool, run.run_id, run.tenant_id, name, run.agent.name, call
    )
    return result


# -- the end -----------------------------------------------------------------------------


async def finish(
    run: RunContext, target: RunStatus, reason: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Step `finish`: the run's terminal status with its reason, and the conversation not yet
    in memory, in one commit. A failed or cancelled run first undoes its compensable effects
    (steps `compensate-{call_id}`), and any run destroys its sandboxes (steps
    `sandbox-destroy-{n}`)."""
    payload = {"reason": reason, **(details or {})}
    if target in (RunStatus.FAILED, RunStatus.CANCELLED) and run.compensable:
        payload["compensations"] = await compensate(run.run_id, run.compensable, run.agent.name)
    if run.sandboxes:
        await destroy_sandboxes(run)
    # The conversation not yet in memory commits with the terminal status. A scoped agent's
    # conversation is its own and never saved.
    memory = (
        {
            "tenant_id": run.tenant_id,
            "conversation_id": run.conversation_id,
            "first_sequence": run.saved,
            "messages": run.unsaved,
        }
        if run.unsaved and not run.scope
        else None
    )
    await run_step(
        "finish", CODE_STEP, steps.finish, run.run_id, target.value, reason, payload, memory
    )
    if memory is not None:
        run.saved += len(run.unsaved)
        run.unsaved = []
    return {"status": target.value, **payload}


async def end_after_failure(run_id: str, run: RunContext | None, exc: Exception) -> dict[str, Any]:
    """What a run's workflow does with an exception nobody planned for (wrap the workflow's
    body in `try`, and hand this every Exception, with the run's context once it has one).

    A failure nobody planned for (a tool's KeyError, a step out of its retry budget) ends the
    run failed with reason internal_error, after its compensations; the model is told nothing.
    A run cancelled underneath was settled by whoever cancelled it. A journal that no longer
    matches the code is re-raised: no step may be added, and the sweeper settles the run.
    """
    name = error_name(exc)
    if name in NONDETERMINISM:
        raise exc
    if name == "RunStopped":
        return {"status": "stopped"}
    if isinstance(exc, RunBudgetExceeded) and run is not None:
        # Planned for: the run spent its budget (a think with none left), in its own code
        # or after a child episode spent it. It ends failed with that reason.
        log.info("run %s: %s", run_id, exc)
        return await finish(run, RunStatus.FAILED, exc.reason, {"error": str(exc), **exc.details})
    log.warning("run %s failed: %s", run_id, describe(exc), exc_info=exc)
    details = {"error": describe(exc)}
    if run is not None:
        return await finish(run, RunStatus.FAILED, "internal_error", details)
    payload = {"reason": "internal_error", **details}
    await run_step(
        "finish", CODE_STEP, steps.finish, run_id, RunStatus.FAILED.value, "internal_error", payload
    )
    return {"status": RunStatus.FAILED.value, **payload}


async def compensate(
    run_id: str, compensable: list[dict[str, Any]], agent_name: str = ""
) -> list[dict[str, Any]]:
    """Undo the run's compensable effects, newest first, each as a new effect; wait for each.

    A compensation that fails is parked for a person by the ledger; the run does not wait
    for that person longer than the tool's policy deadline, and the parked effect keeps its
    owner (this run) for whoever resolves it.
    """
    outcomes = []
    for item in reversed(compensable):
        name = f"compensate-{item['call_id']}"
        seen: dict[str, Any] = await run_step(
            name,
            CODE_STEP,
            compensation_steps.record_compensation,
            run_id,
            item.get("agent") or agent_name,
            item["tool"],
            item["key"],
            item["ref"],
        )
        hit("loop.after_compensation_recorded")
        # Not capped by the run's deadline: a run failing for its deadline still undoes.
        wait_s = get_runtime().policy.for_write_tool(item["tool"]).deadline_s
        until = seen["now"] + wait_s
        wakes = 0
        while seen["status"] not in write_steps.SETTLED and seen["now"] < until:
            await DBOS.recv_async(seen["key"], max(0.0, until - time.time()))
            wakes += 1
            check = f"{name}-{wakes}"
            seen = await run_step(
                check, CODE_STEP, write_steps.read_outcome, run_id, check, seen["key"], False
            )
        outcomes.append({"key": seen["key"], "status": seen["status"]})
    compensable.clear()
    return outcomes
