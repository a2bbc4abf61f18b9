"""The durable agent loop: one DBOS workflow per run.

    memory-load
    think-{i}  [think-{i}-strong]  tool-{i}-{call_id}...  memory-save-{i}     (i < max_iterations)
    finish

Each name is a step; a crash anywhere resumes at the first step without a checkpoint. The
workflow code between steps must be deterministic: it only looks at step results (time too
comes from them), so a resumed run makes the same decisions it made before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dbos import DBOS, StepOptions

from ledgerloop.agent import steps
from ledgerloop.agent.definition import get_agent
from ledgerloop.agent.steps import CODE_STEP, MODEL_STEP, is_empty_turn
from ledgerloop.faults import hit
from ledgerloop.models.client import Tier
from ledgerloop.runs.states import RunStatus
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry import agent_span, span_context_from_dict, span_context_to_dict
from ledgerloop.tools.registry import ToolKind

WORKFLOW_NAME = "ledgerloop_run"
QUEUE_NAME = "ledgerloop_runs"


async def _step(name: str, options: StepOptions, fn: Callable[..., Any], *args: Any) -> Any:
    named: StepOptions = {**options, "name": name}
    return await DBOS.run_step_async(named, fn, *args)


@DBOS.workflow(name=WORKFLOW_NAME)
async def ledgerloop_run(run_id: str) -> dict[str, Any]:
    return await AgentLoop(run_id).run()


class AgentLoop:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.settings = get_runtime().settings
        #: Succeeded effects with a compensating action, undone if the run fails or is cancelled.
        self.compensable: list[dict[str, Any]] = []

    async def run(self) -> dict[str, Any]:
        # Every execution, replays included, is its own invoke_agent span (so it is opened
        # outside any step); the agent's name is known once memory-load has read the run.
        with agent_span("", self.run_id) as invocation:
            here = span_context_to_dict(invocation.span_context)
            ctx: dict[str, Any] = await _step(
                "memory-load", CODE_STEP, steps.memory_load, self.run_id, here
            )
            if "terminal" in ctx:
                return {"status": ctx["terminal"]}
            agent = get_agent(ctx["agent"])
            assert agent is not None  # memory-load failed the run otherwise
            invocation.name_agent(agent.name)
            first = ctx.get("trace") or {}
            if first and first != here:
                # A resumed execution: link to the execution that started the run.
                invocation.span.add_link(span_context_from_dict(first))
            self.agent = agent
            self.tenant_id: str = ctx["tenant_id"]
            self.conversation_id: str = ctx["conversation_id"]
            self.deadline: float = ctx["deadline"]
            self.saved = 0  # messages of this run already in memory
            self.messages: list[dict[str, Any]] = ctx["messages"]
            # The new user message is saved with the first turn; history by earlier runs.
            self.unsaved: list[dict[str, Any]] = self.messages[ctx["history_len"] :]
            return await self._turns(ctx["now"])

    async def _turns(self, now: float) -> dict[str, Any]:
        rejected = 0
        empty_turns = 0
        for i in range(self.settings.max_iterations):
            if now > self.deadline:
                return await self._finish(RunStatus.FAILED, "deadline_exceeded", {})
            think = await self._think(i, Tier(self.agent.tier))
            if "response" in think and is_empty_turn(think["response"]):
                empty_turns += 1
                # Never re-send an empty turn to the same tier: it answers nothing again.
                if think["tier"] != Tier.STRONG.value:
                    think = await self._think(i, Tier.STRONG, suffix="-strong")
            hit("loop.after_think")
            if "error" in think:
                return await self._finish(
                    RunStatus.FAILED, "model_call_failed", {"model_error": think["error"]}
                )
            response = think["response"]
            now = think["now"]
            if is_empty_turn(response):
                return await self._finish(
                    RunStatus.FAILED, "empty_turns", {"empty_turns": empty_turns}
                )
            content: list[dict[str, Any]] = response["content"]
            # Only the content is needed from here on; a run may now wait hours for an
            # approval, and thousands of waiting runs should not each hold a whole response.
            del think, response
            assistant = {"role": "assistant", "content": content}
            calls = [b for b in content if b.get("type") == "tool_use"]
            if not calls:
                text = "".join(b.get("text", "") for b in content if b["type"] == "text")
                problem = self.agent.validate_answer(text) if self.agent.validate_answer else None
                if problem is None:
                    return await self._save_turn(
                        i,
                        [assistant],
                        RunStatus.SUCCEEDED,
                        "succeeded",
                        {"answer": text, "turns": i + 1, "empty_turns": empty_turns},
                    )
                rejected += 1
                if rejected > self.settings.max_rejected_answers:
                    return await self._finish(
                        RunStatus.FAILED, "rejected_answers", {"rejected_answers": rejected}
                    )
                feedback = {"role": "user", "content": f"Your answer was rejected: {problem}"}
                await self._save_turn(
                    i,
                    [assistant, feedback],
                    RunStatus.PLANNING,
                    "answer_rejected",
                    {"reason": problem},
                )
                continue
            results = []
            for call in calls:
                outcome = await self._act(i, call)
                if outcome.get("stop"):
                    return {"status": outcome["stop"]}
                results.append(outcome["result"])
            hit("loop.after_tools")
            user = {"role": "user", "content": results}
            saved = await self._save_turn(
                i,
                [assistant, user],
                RunStatus.PLANNING,
                "tool_results",
                {"tool_calls": len(calls)},
            )
            now = saved["now"]
        return await self._finish(
            RunStatus.FAILED, "iteration_cap", {"max_iterations": self.settings.max_iterations}
        )

    async def _think(self, i: int, tier: Tier, suffix: str = "") -> dict[str, Any]:
        name = f"think-{i}{suffix}"
        result: dict[str, Any] = await _step(
            name,
            MODEL_STEP,
            steps.think,
            self.run_id,
            name,
            self.agent.name,
            tier.value,
            self.messages,
        )
        return result

    async def _act(self, i: int, call: dict[str, Any]) -> dict[str, Any]:
        name = f"tool-{i}-{call['id']}"
        tool = self.agent.tool(str(call.get("name")))
        if tool is not None and tool.kind is ToolKind.WRITE:
            from ledgerloop.agent.act_write import act_write

            written: dict[str, Any] = await act_write(self, i, call, tool)
            return written
        result = await _step(
            name,
            CODE_STEP,
            steps.run_read_tool,
            self.run_id,
            self.tenant_id,
            name,
            self.agent.name,
            call,
        )
        return {"result": result}

    async def _save_turn(
        self,
        i: int,
        new_messages: list[dict[str, Any]],
        target: RunStatus,
        event: str,
        payload: dict[str, Any],
    ) -> dict[str, Any]:
        batch = [*self.unsaved, *new_messages]
        state = {"turn": i, **payload} if target is RunStatus.SUCCEEDED else {"turn": i}
        saved: dict[str, Any] = await _step(
            f"memory-save-{i}",
            CODE_STEP,
            steps.memory_save,
            self.run_id,
            self.tenant_id,
            self.conversation_id,
            i,
            self.saved,
            batch,
            target.value,
            event,
            payload,
            state,
        )
        self.messages.extend(new_messages)
        self.saved += len(batch)
        self.unsaved = []
        return saved if target is not RunStatus.SUCCEEDED else {"status": target.value, **payload}

    async def _finish(
        self, target: RunStatus, reason: str, details: dict[str, Any]
    ) -> dict[str, Any]:
        payload = {"reason": reason, **details}
        if target in (RunStatus.FAILED, RunStatus.CANCELLED) and self.compensable:
            from ledgerloop.agent.act_write import compensate_all

            payload["compensations"] = await compensate_all(self)
        await _step("finish", CODE_STEP, steps.finish, self.run_id, target.value, reason, payload)
        return {"status": target.value, **payload}
