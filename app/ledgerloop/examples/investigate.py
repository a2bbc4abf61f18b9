"""Investigate: a child episode reads logs and configuration, the parent decides what happens.

The run belongs to the `investigate` agent; its orchestration never lets a model act:

    investigate.episode-0 (a child workflow)     the `investigator` reads the directory with
        investigator.p0.think-0                  file tools confined to it, and answers a
        investigator.p0.tool-0-{call_id} ...     Remediation (a JSON object, validated; a
                                                 rejected answer goes back with the error)
    approve-0-remediation                        a person approves the proposed change...
    tool-0-remediation                           ...filed once, as a change ticket (an effect
                                                 with an idempotency key, through the outbox)
    memory-save-0                                the proposal and what became of it

A proposal of `action: none` ends the run with nothing to approve and nothing written. The
budgets are the parent's constants (BUDGET), not the model's.

Load it with LEDGERLOOP_AGENT_MODULES=ledgerloop.examples.investigate; its scripted
conversation is ledgerloop/models/scripts/investigate.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ledgerloop.agent.context import Approved, RunContext, Stop
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.agent.episodes import EpisodeBudget, EpisodeError, run_episode
from ledgerloop.agent.orchestration import orchestration
from ledgerloop.agent.primitives import finish, memory_save, wait_for_approval, write_effect
from ledgerloop.examples.ops_agent import write_ticket
from ledgerloop.runs.states import RunStatus
from ledgerloop.tools.files import file_tools

#: The directory the investigator may read (and nothing outside it).
DATA_ROOT = Path(__file__).resolve().parent / "data" / "investigate"

#: Six turns a pass, two passes, two rejected answers over the whole episode.
BUDGET = EpisodeBudget(turns=6, passes=2, rejected_answers=2)

#: The id of the parent's one write call (its idempotency key is `{run_id}:remediation`).
CALL_ID = "remediation"


class Remediation(BaseModel):
    """What the investigator proposes: one configuration change, or nothing."""

    action: Literal["change_config", "none"]
    summary: str = Field(min_length=10, max_length=500, description="The cause, in brief")
    evidence: list[str] = Field(
        min_length=1, max_length=10, description="file:line references that show the cause"
    )
    file: str | None = Field(default=None, description="The configuration file to change")
    key: str | None = Field(default=None, description="Dotted key in that file")
    value: str | None = Field(default=None, description="The key's new value")

    @model_validator(mode="after")
    def _change_is_complete(self) -> Remediation:
        if self.action == "change_config" and not (self.file and self.key and self.value):
            raise ValueError("change_config needs file, key and value")
        return self


INVESTIGATOR = register_agent(
    Agent(
        name="investigator",
        system=(
            "You investigate an incident from the files you can read: logs and configuration. "
            "Find the cause, cite the lines that show it, and propose at most one "
            "configuration change; propose none when the files do not support one."
        ),
        tools=file_tools(DATA_ROOT),
    )
)

INVESTIGATE = register_agent(
    Agent(
        name="investigate",
        system="Investigates with a read-only child episode; applies its proposal on approval.",
        tools=(write_ticket,),
    )
)


def change_ticket(proposal: Remediation) -> dict[str, Any]:
    """The change ticket that applies a proposal (the write call's input)."""
    evidence = "\n".join(f"- {line}" for line in proposal.evidence)
    return {
        "title": f"Config change: {proposal.key} = {proposal.value} in {proposal.file}"[:200],
        "body": f"{proposal.summary}\n\nEvidence:\n{evidence}",
        "priority": "high",
    }


@orchestration(INVESTIGATE)
async def investigate(run: RunContext) -> dict[str, Any]:
    question = run.messages[-1]["content"]
    try:
        proposal = await run_episode(
            run, INVESTIGATOR, {"message": question}, output=Remediation, budget=BUDGET
        )
    except EpisodeError as exc:
        details = {"episode": exc.episode, "episode_reason": exc.reason, "error": str(exc)}
        return await finish(run, RunStatus.FAILED, "investigation_ended", details)
    if proposal.action == "none":
        return await _done(run, proposal, applied=False, outcome="nothing to apply")
    call: dict[str, Any] = {
        "type": "tool_use",
        "id": CALL_ID,
        "name": write_ticket.name,
        "input": change_ticket(proposal),
    }
    decision = await wait_for_approval(run, 0, call, write_ticket)
    if isinstance(decision, Stop):
        return await finish(run, decision.status, decision.reason, decision.details)
    if not isinstance(decision, Approved):
        # Rejected (the policy says on_reject: continue): the run ends, nothing written.
        return await _done(run, proposal, applied=False, outcome=str(decision["content"]))
    result = await write_effect(run, 0, call, write_ticket, decision)
    if isinstance(result, Stop):
        return await finish(run, result.status, result.reason, result.details)
    applied = not result.get("is_error")
    return await _done(run, proposal, applied=applied, outcome=str(result["content"]))


async def _done(
    run: RunContext, proposal: Remediation, *, applied: bool, outcome: str
) -> dict[str, Any]:
    payload = {"proposal": proposal.model_dump(mode="json"), "applied": applied, "outcome": outcome}
    await memory_save(run, 0, [], RunStatus.SUCCEEDED, "succeeded", payload)
    return {"status": RunStatus.SUCCEEDED.value, **payload}
