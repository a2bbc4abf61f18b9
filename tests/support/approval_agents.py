"""An orchestration that spends an approval as a user's code could: on its own call, on
another call with the same arguments, or (given another run's approval) in another run.

Loaded beside tests.support.agents by tests/integration/test_approval_binding.py; its write
tool is the ops agent's `write_ticket`, which tests/support/policy.yaml sends to a person.
Every name it uses is public (`ledgerloop.__all__`).
"""

from __future__ import annotations

import json
from typing import Any

from ledgerloop import (
    Agent,
    Approved,
    RunContext,
    RunStatus,
    finish,
    memory_save,
    orchestration,
    register_agent,
    wait_for_approval,
    write_effect,
)
from ledgerloop.examples.ops_agent import write_ticket

#: The one action every call asks for: the same arguments, so the same action hash.
TICKET = {"title": "refund acme", "body": "charged twice", "priority": "high"}

SPENDER = register_agent(
    Agent(
        name="approval_spender",
        system="(never asked: the orchestration makes its calls itself)",
        tools=(write_ticket,),
        first_message=lambda run_input: json.dumps(run_input),
    )
)


def _call(call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": write_ticket.name, "input": TICKET}


def _seen(result: Any) -> dict[str, Any]:
    """What a write_effect answered, as the run's state keeps it."""
    if not isinstance(result, dict):  # a Stop
        return {"stop": result.reason}
    return {"content": result["content"], "is_error": result.get("is_error", False)}


@orchestration(SPENDER)
async def spend(run: RunContext) -> dict[str, Any]:
    asked = json.loads(run.messages[-1]["content"])
    results: dict[str, Any] = {}
    borrowed = asked.get("approval")
    if borrowed is not None:
        # Another run's approval, named by its id and action hash, for a call of the same
        # id and arguments in this run.
        approved = Approved(borrowed["action_hash"], borrowed["approval_id"])
        results["pay-a"] = _seen(await write_effect(run, 0, _call("pay-a"), write_ticket, approved))
    else:
        decision = await wait_for_approval(run, 0, _call("pay-a"), write_ticket)
        if not isinstance(decision, Approved):
            return await finish(run, RunStatus.FAILED, "not_approved", {"decision": str(decision)})
        approved = decision
        results["pay-a"] = _seen(await write_effect(run, 0, _call("pay-a"), write_ticket, approved))
        # pay-a's approval handed to another call with the same arguments.
        results["pay-b"] = _seen(await write_effect(run, 1, _call("pay-b"), write_ticket, approved))
    payload = {
        "results": results,
        "approval": {"approval_id": approved.approval_id, "action_hash": approved.action_hash},
    }
    await memory_save(run, 0, [], RunStatus.SUCCEEDED, "succeeded", payload)
    return {"status": "succeeded", **payload}
