"""A tool turn with writes, run inside the next think step: the step body `think_after_tools`.

A turn whose calls are read tools and plain write tools (the agent's own HTTP writes that no
approval can be asked for) has no steps of its own. The next think step runs its calls in
order, each write recorded with its outbox row and the run's move to executing in one commit
(`write_steps.record_effect`, under the write's own step name `tool-{i}-{call_id}`, so its
run event, span and idempotency key are those a step of its own would have had), and
delivered by this worker's relay at once. When every write settles, the run moves back to
planning and the model is called, all in the one step: the write's checkpoint and its step's
journal check are gone from the turn. The move back rides in the last write's outcome record
(the relay's one statement), so it costs the turn no commit of its own.

When a write does not settle at once (the downstream is slow, its outcome is unknown, the
relay runs elsewhere), the step ends there, before the model call, and says which call is
pending; the workflow then waits for it durably (`outcome-{i}-{call_id}-{n}`) as it waits
for a write step's outcome, runs the turn's remaining calls as steps of their own, and calls
the model in step `think-{i+1}-settled`.

Repeating the step (the worker died before its checkpoint) is safe: a read runs again, a
write finds its effect by its idempotency key (recorded once; delivered at most once by the
outbox), and a run event is recorded once per step name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ledgerloop.agent import steps, write_steps
from ledgerloop.faults import hit
from ledgerloop.runs.states import RunStatus

log = logging.getLogger(__name__)


async def think_after_tools(
    run_id: str,
    step_name: str,
    agent_name: str,
    tier: str,
    messages: list[dict[str, Any]],
    mcp_tools: list[dict[str, Any]] | None,
    replan: bool,
    save: dict[str, Any] | None,
    turn: dict[str, Any],
) -> dict[str, Any]:
    """The previous turn's calls, then the model call (`steps.think`).

    `turn`: {"message": the turn's assistant message, "tenant_id", "writes": {call id: tool
    name} for the calls that are writes, "tool_step": the prefix of their step names,
    "moves": whether this agent moves the run back to planning (a scoped agent does not)}.
    The result is `steps.think`'s with `reads` (every call's tool result, in order) and
    `writes` (each recorded write: call id, tool and what its record read), or, when a
    write did not settle, `pending` (that write) with the results before it and no model
    call.
    """
    tenant_id: str = turn["tenant_id"]
    writes: dict[str, str] = turn["writes"]
    calls = [c for c in turn["message"]["content"] if c.get("type") == "tool_use"]
    # The run moves back to planning once the turn's writes settled. The last write's own
    # record does it (no commit of its own), unless this step moves anyway (`replan`: it
    # came back from an earlier wait) or the agent does not move the run (scoped).
    moves = bool(turn.get("moves", True))
    last_write = next((str(c["id"]) for c in reversed(calls) if str(c["id"]) in writes), None)
    carried: asyncio.Future[bool] | None = None  # the record that carries the move
    results: list[dict[str, Any]] = []
    recorded_writes: list[dict[str, Any]] = []
    # The records of outcomes this worker sent, still being written while the model is asked.
    records: list[tuple[int, asyncio.Future[bool]]] = []
    for call in calls:
        call_id = str(call["id"])
        tool_name = writes.get(call_id)
        if tool_name is None:
            results.append(
                await steps.run_read_tool(run_id, tenant_id, step_name, agent_name, call)
            )
            continue
        carries = moves and not replan and call_id == last_write
        recorded, record = await write_steps.record_and_send(
            run_id,
            tenant_id,
            f"{turn['tool_step']}{call_id}",
            agent_name,
            tool_name,
            call,
            replan_step=step_name if carries else None,
        )
        if "result" in recorded:  # refused before anything was recorded (bad arguments)
            results.append(recorded["result"])
            continue
        # Where a write step's crash tests kill a worker: the effect is recorded (and, when
        # this worker delivers, sent) and the step that holds it has no checkpoint yet.
        hit("loop.after_effect_recorded")
        written = {"call_id": call_id, "tool": tool_name, "recorded": recorded}
        if "outcome" not in recorded:
            return {
                "pending": written,
                "reads": results,
                "writes": recorded_writes,
                "now": time.time(),
            }
        if record is not None:
            records.append((len(results), record))
            if carries:
                carried = record
        recorded_writes.append(written)
        results.append(write_steps.settled_result(call_id, recorded["outcome"]))
    hit("think.after_tools")
    turn_messages = [turn["message"], {"role": "user", "content": results}]
    # Back to planning once the writes settled: the run moved to executing with each. This
    # step moves it itself unless the last write's record does (no record to carry it: the
    # effect was found already recorded, on a repeat of this step, or another relay sends).
    moving = replan or (bool(recorded_writes) and moves and carried is None)
    thought = await steps.think(
        run_id, step_name, agent_name, tier, [*messages, *turn_messages], mcp_tools, moving
    )
    # The model was asked while the outcomes were being recorded; nothing durable is made of
    # them (the answer's save, this step's checkpoint) before they are.
    for index, record in records:
        if not await record:
            lost = await _lost_record(recorded_writes, results, index)
            if lost is not None:
                return lost
            if record is carried:
                # Someone else recorded the same outcome first; the move is still this step's.
                await asyncio.to_thread(
                    steps.transition, run_id, RunStatus.PLANNING.value, "planning", {}, step_name
                )
    result = {**thought, "reads": results, "writes": recorded_writes}
    answered = "response" in result and steps.answer_text(result["response"]) is not None
    if save is not None and answered:
        saved = {**save, "unsaved": [*save["unsaved"], *turn_messages]}
        result = await asyncio.to_thread(steps.save_answer, run_id, saved, result)
    return result


async def _lost_record(
    written: list[dict[str, Any]], results: list[dict[str, Any]], index: int
) -> dict[str, Any] | None:
    """Someone else settled a write this worker sent before its outcome was recorded (the
    relay's lease ran out, a person resolved it): the row's outcome counts. The same outcome
    changes nothing; another one, or none yet, makes this step end at that write as if it
    had not settled (the model's answer, given the wrong result, is dropped)."""
    call_id = results[index]["tool_use_id"]
    write = next(w for w in written if w["call_id"] == call_id)
    row = await write_steps.read_effect(write["recorded"]["key"])
    if row.get("outcome") == write["recorded"]["outcome"]:
        return None
    log.warning("effect %s was settled by someone else first", write["recorded"]["key"])
    pending = {**write, "recorded": {**write["recorded"], **row}}
    before = written[: written.index(write)]
    return {"pending": pending, "reads": results[:index], "writes": before, "now": time.time()}
