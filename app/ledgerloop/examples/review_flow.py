"""Two agents in a custom orchestration: a researcher drafts with its tools, a reviewer judges.

The run belongs to the researcher (start it as agent "researcher"); the orchestration below
replaces the built-in turns for its runs. It is written with the same durable primitives as
the built-in loop, so every step is journaled under a stable name and a crash anywhere
resumes where it stopped:

    memory-load  think-0  tool-0-{call_id}  memory-save-0  think-1   (the researcher)
    review.think-0                                                   (the reviewer, scoped)
    memory-save-1                                                    (the answer and verdict)

Load it with LEDGERLOOP_AGENT_MODULES=ledgerloop.examples.review_flow.
"""

from __future__ import annotations

from typing import Any

from ledgerloop.agent.context import RunContext, Stop
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.agent.orchestration import orchestration
from ledgerloop.agent.primitives import act, finish, memory_save, think
from ledgerloop.examples.ops_agent import search_kb
from ledgerloop.runs.states import RunStatus

#: Turns the researcher gets to draft its answer (the orchestration's budget, not a prompt's).
DRAFT_TURNS = 4

RESEARCHER = register_agent(
    Agent(
        name="researcher",
        system="Answer the operator's question. Search the runbooks first; cite what you use.",
        tools=(search_kb,),
    )
)

REVIEWER = register_agent(
    Agent(
        name="reviewer",
        system=("You review an operations answer. Reply 'APPROVED: <why>' or 'CHANGES: <what>'."),
        tools=(),
    )
)


@orchestration(RESEARCHER)
async def research_then_review(run: RunContext) -> dict[str, Any]:
    for i in range(DRAFT_TURNS):
        thought = await think(run, i)
        if thought.error is not None or thought.empty:
            return await finish(run, RunStatus.FAILED, "model_call_failed", {"turn": i})
        calls = thought.tool_calls
        if not calls:
            return await _review(run, i, thought.message(), thought.text)
        results = []
        for call in calls:
            outcome = await act(run, i, call)
            if isinstance(outcome, Stop):
                return await finish(run, outcome.status, outcome.reason, outcome.details)
            results.append(outcome)
        await memory_save(
            run,
            i,
            [thought.message(), {"role": "user", "content": results}],
            RunStatus.PLANNING,
            "tool_results",
            {"tool_calls": len(calls)},
        )
    return await finish(run, RunStatus.FAILED, "iteration_cap", {"max_iterations": DRAFT_TURNS})


async def _review(
    run: RunContext, i: int, draft_message: dict[str, Any], draft: str
) -> dict[str, Any]:
    reviewer = run.with_agent(
        REVIEWER,
        scope="review.",
        messages=[{"role": "user", "content": f"Review this answer:\n\n{draft}"}],
    )
    verdict = await think(reviewer, 0)
    if verdict.error is not None or verdict.empty:
        return await finish(run, RunStatus.FAILED, "model_call_failed", {"agent": "reviewer"})
    approved = verdict.text.startswith("APPROVED")
    outcome = {"answer": draft, "review": verdict.text, "approved": approved, "turns": i + 1}
    await memory_save(run, i, [draft_message], RunStatus.SUCCEEDED, "succeeded", outcome)
    return {"status": RunStatus.SUCCEEDED.value, **outcome}
