"""The built-in agent loop: one DBOS workflow per run, written with the durable primitives.

    memory-load
    [messages-{i}]  think-{i}  [think-{i}-strong]  tool-{i}-{call_id}...  (i < max_iterations)
    [memory-save-{i}] (a rejected answer, or an answer to validate) | finish

A turn that asks only for read tools and plain writes (no approval possible) has no tool
steps: its tools run at the start of the next think step, and their results are journaled
with that model call (`think(reads=)`, agent.turn_tools), so such a tool turn is one step.
A write whose outcome is not settled at once ends that step early; the run waits for it and
calls the model in `think-{i}-settled`. Approvals, sandboxed commands and MCP tools keep
their `tool-{i}-{call_id}` steps. A tool turn's messages are in journaled results, and reach
conversation memory with the run's final save, in the same commit as the run's terminal
status. The final save of an answer nothing may refuse is made by the think
step that got it (in one statement, under the name memory-save-{i}), so a run ends with its
last think step.

A message a person sent the run (POST /v1/runs/{id}/messages) joins the conversation at the
next turn boundary, in step `messages-{i}` (agent.messages), which only a boundary with a
message to take has.

Each name is a step (ledgerloop.agent.primitives); a crash anywhere resumes at the first step
without a checkpoint. The code between steps only looks at step results (time too comes from
them), so a resumed run makes the same decisions it made before.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import nullcontext
from typing import Any

from dbos import DBOS

from ledgerloop.agent import dbos_waiters, tracing
from ledgerloop.agent.context import Ended, Message, RunContext, Stop
from ledgerloop.agent.hibernation import hibernating_allowed
from ledgerloop.agent.keep import forget_workflow
from ledgerloop.agent.messages import (
    join_conversation,
    listening,
    messages_due,
    take_messages,
)
from ledgerloop.agent.orchestration import get_orchestration
from ledgerloop.agent.primitives import (
    act,
    end_after_failure,
    finish,
    memory_load,
    memory_save,
    next_ride,
    only_reads,
    remember,
    rides_think,
    think,
)
from ledgerloop.agent.stepping import QUEUE_NAME, WORKFLOW_NAME
from ledgerloop.agent.tracing import count_call
from ledgerloop.effects.hashing import inherited_calls
from ledgerloop.errors import LedgerloopError
from ledgerloop.faults import hit
from ledgerloop.fleet.guard import executing
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_get
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry.executions import Execution, execution_span
from ledgerloop.telemetry.runtrace import RunFacts, under_root

__all__ = ["QUEUE_NAME", "WORKFLOW_NAME", "ledgerloop_run", "run_turns"]


class ForeignWorkflow(LedgerloopError):
    """A workflow of a run started under an id other than the run's own: it does nothing."""


@DBOS.workflow(name=WORKFLOW_NAME)
async def ledgerloop_run(run_id: str) -> dict[str, Any]:
    # A run executes only under its own workflow id: approvals, effects and their messages
    # are addressed to that id, and the fence judges ownership by it. A second workflow of
    # the same run (enqueued by hand, or by a role that could write DBOS's tables) would
    # pay for the run's model calls again; it ends here, before any step, in ERROR, where
    # `ledgerloop runs stuck` lists it.
    workflow_id = DBOS.workflow_id
    if workflow_id is not None and workflow_id != run_id:
        # A fork (control/fork.py): its own run, whose journal up to the fork point is its
        # parent's; DBOS gave it the parent's input. It runs as itself from here on.
        inherited = await _fork_of(workflow_id, run_id)
        if inherited is not None:
            run_id = workflow_id
            inherited_calls.set((run_id, inherited))
    if DBOS.workflow_id != run_id:
        raise ForeignWorkflow(
            f"workflow {DBOS.workflow_id} is not run {run_id}'s own workflow (whose id is the "
            "run's); it ran nothing",
            fix="start runs with ledgerloop.start_run, POST /v1/runs or `ledgerloop runs start`",
        )
    # Known to the fence, so a stopping worker can end this execution between steps.
    with executing():
        try:
            return await _execute(run_id)
        finally:
            forget_workflow(run_id)  # what its steps kept for a retry (agent.keep)


async def _fork_of(workflow_id: str, parent_id: str) -> dict[str, str] | None:
    """The calls a fork inherited (call id -> the run that asked for it) when workflow
    `workflow_id` is a fork of run `parent_id`, else None. Read outside a step: the link is
    written before the fork's workflow exists and never changes, so a replay reads the same."""
    try:
        fork_id = uuid.UUID(workflow_id)
    except ValueError:
        return None

    def read() -> dict[str, Any] | None:
        with get_runtime().pool.connection() as conn:
            found = run_get(conn, fork_id)
        return found.state.get("forked_from") if found is not None else None

    forked = await asyncio.to_thread(read)
    if not isinstance(forked, dict) or forked.get("run_id") != parent_id:
        return None
    return {str(k): str(v) for k, v in (forked.get("inherited_calls") or {}).items()}


async def _execute(run_id: str) -> dict[str, Any]:
    hibernating_allowed.set(True)
    context: RunContext | None = None  # once memory-load made it: what a failure must undo
    try:
        # One trace per run (telemetry.runtrace): this execution's identity is fixed before
        # its first step and journaled by memory-load; its span opens once the agent is known.
        execution = Execution(run_id)
        run = await memory_load(run_id, execution.token())
        if isinstance(run, Ended):
            return {"status": run.status}
        context = run
        if run.trace.get("span_id") != execution.token()["span_id"]:
            await tracing.resume(execution, run.trace)  # a resumed execution: off the hot path
        facts = RunFacts(
            run_id,
            run.agent.name,
            tenant_id=run.tenant_id,
            conversation_id=run.conversation_id,
            created_ns=run.created_ns,
        )
        # A replay harness (deploy checks) runs this function too: no spans from a replay.
        live = dbos_waiters.in_workflow()
        resumed = run.trace.get("span_id") != execution.token()["span_id"]
        with (
            execution_span(execution, facts) if live else nullcontext(),
            listening(run_id, resumed),
        ):
            orchestrate = get_orchestration(run.agent.name)
            if orchestrate is not None:
                return await orchestrate(run)
            return await run_turns(run)
    except Exception as exc:
        # Outside any execution span: what the failure path opens stays in the run's trace.
        with under_root(run_id):
            return await end_after_failure(run_id, context, exc)


async def run_turns(run: RunContext, max_turns: int | None = None) -> dict[str, Any]:
    """The agent's turns until it answers, fails or runs out of turns; then `finish`.

    `max_turns` defaults to the run's iteration budget (journaled by memory-load). Turns
    spent before (another agent's, a child episode's) count against that budget too: a
    think with none left ends the run with `iteration_cap` (agent.budgets)."""
    settings = get_runtime().settings
    if max_turns is None:
        budgeted = run.budget.iterations
        max_turns = settings.max_iterations if budgeted is None else budgeted
    rejected = 0
    empty_turns = 0
    # A turn that asked only for read tools: they run inside the next think step.
    reads: Message | None = None
    for i in range(max_turns):
        if run.now > run.deadline:
            if reads is not None:  # answered, so the saved conversation stays well formed
                await _act_all(run, i - 1, reads)
            return await finish(run, RunStatus.FAILED, "deadline_exceeded")
        if reads is not None and only_reads(run, reads["content"]) and await messages_due(run, i):
            # A message joins the conversation after the previous turn's tool results: its
            # reads run as steps of their own here instead of inside this think step. The
            # messages are taken first, so the journal holds the decision before those steps.
            received = await take_messages(run, i, join=False)
            calls = [c for c in reads["content"] if c.get("type") == "tool_use"]
            count_call("tool", -len(calls))  # counted when they were to ride
            stop = await _act_all(run, i - 1, reads)
            reads = None
            if stop is not None:
                return await finish(run, stop.status, stop.reason, stop.details)
            join_conversation(run, received)
        elif reads is None and await messages_due(run, i):
            await take_messages(run, i)
        thought = await think(
            run,
            i,
            save_answer=True,
            empty_turns_before=empty_turns,
            reads=reads,
            ride=next_ride(run, i, max_turns),
        )
        reads = None
        if thought.stop is not None:
            return await finish(run, thought.stop.status, thought.stop.reason, thought.stop.details)
        empty_turns += thought.empty_turns
        if thought.error is not None:
            return await finish(
                run, RunStatus.FAILED, "model_call_failed", {"model_error": thought.error}
            )
        if thought.empty:
            return await finish(run, RunStatus.FAILED, "empty_turns", {"empty_turns": empty_turns})
        calls = thought.tool_calls
        if not calls:
            validate = run.agent.validate_answer
            problem = validate(thought.text) if validate else None
            if problem is None:
                answer = {"answer": thought.text, "turns": i + 1, "empty_turns": empty_turns}
                if thought.saved:  # by the think step itself
                    return {"status": RunStatus.SUCCEEDED.value, **answer}
                await memory_save(
                    run, i, [thought.message()], RunStatus.SUCCEEDED, "succeeded", answer
                )
                return {"status": RunStatus.SUCCEEDED.value, **answer}
            rejected += 1
            if rejected > settings.max_rejected_answers:
                return await finish(
                    run, RunStatus.FAILED, "rejected_answers", {"rejected_answers": rejected}
                )
            feedback = {"role": "user", "content": f"Your answer was rejected: {problem}"}
            # The next deadline check reads the think's time, not the save's: journaled runs
            # made that decision so, and a resumed run must make it the same way.
            thought_time = run.now
            await memory_save(
                run,
                i,
                [thought.message(), feedback],
                RunStatus.PLANNING,
                "answer_rejected",
                {"reason": problem},
            )
            run.now = thought_time
            continue
        if i + 1 < max_turns and rides_think(run, calls):
            for _ in calls:
                count_call("tool")
            reads = thought.message()
            continue
        stop = await _act_all(run, i, thought.message())
        if stop is not None:
            return await finish(run, stop.status, stop.reason, stop.details)
    return await finish(run, RunStatus.FAILED, "iteration_cap", {"max_iterations": max_turns})


async def _act_all(run: RunContext, i: int, message: Message) -> Stop | None:
    """Turn `i`'s tool calls, a step each (`act`), then the turn joins the conversation."""
    results = []
    for call in message["content"]:
        if call.get("type") != "tool_use":
            continue
        outcome = await act(run, i, call)
        if isinstance(outcome, Stop):
            return outcome
        results.append(outcome)
    hit("loop.after_tools")
    remember(run, [message, {"role": "user", "content": results}])
    return None
