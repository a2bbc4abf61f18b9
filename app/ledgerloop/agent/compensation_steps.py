"""The step bodies that undo a run's effects: a compensation is an effect of its own (its own
key, `{key}:compensate`, outbox row and audit trail), begun for a succeeded effect whose tool
declares how to undo it (`compensate_path`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ledgerloop.agent.write_steps import _compensate_path, _find_tool, effect_facts, write_tool
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import (
    COMPENSATION_SUFFIX,
    compensation_begin,
    effect_list,
    effect_require,
)
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus
from ledgerloop.runs.store import run_require
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry.runtrace import span_traceparent
from ledgerloop.tools.registry import Tool


def record_compensation(
    run_id: str, agent_name: str, tool_name: str, key: str, ref: str | None
) -> dict[str, Any]:
    """Begin the compensating effect of `key` (its own key, `...:compensate`, and audit trail)."""
    rt = get_runtime()
    delivery = compensation_delivery(write_tool(agent_name, tool_name), key, ref)

    def record(conn: Conn) -> dict[str, Any]:
        with conn.transaction():
            effect = compensation_begin(conn, effect_require(conn, key), delivery)
        return {"key": effect.key, "status": str(effect.status), "now": time.time()}

    with rt.pool.connection() as conn:
        return record(conn)


def compensation_delivery(tool: Tool, key: str, ref: str | None) -> DeliveryRequest:
    """The request that undoes effect `key` of `tool` (whose downstream reference is `ref`)."""
    path = _compensate_path(tool)
    assert path is not None
    policy = get_runtime().policy.for_write_tool(tool.name)
    return DeliveryRequest(
        path=path.format(ref=ref or "", key=key),
        method="POST",
        idempotency_header=effect_facts(tool).idempotency_header,
        # Compensating calls are declared idempotent: resending one is always safe.
        honours_idempotency=True,
        timeout_ms=policy.timeout_ms,
        max_attempts=policy.max_retries + 1,
        deadline_s=policy.deadline_s,
        traceparent=span_traceparent(),
    )


def compensations_begin(conn: Conn, run_id: uuid.UUID) -> list[dict[str, Any]]:
    """Begin, in the caller's transaction, the compensation of every succeeded effect of the
    run that its tool can undo and that has none yet, newest first.

    For a run settled without its workflow (the sweeper): nobody waits for these outcomes;
    the relay delivers them and each has its own audit trail, as in `primitives.compensate`.
    """
    agent = run_require(conn, run_id).agent
    effects = effect_list(conn, run_id=run_id, limit=1000)
    keys = {e.key for e in effects}
    begun = []
    for effect in effects:  # newest first
        if (
            effect.compensates is not None
            or effect.status is not EffectStatus.SUCCEEDED
            or effect.key + COMPENSATION_SUFFIX in keys
        ):
            continue
        tool = _find_tool(agent, effect.tool)
        if tool is None or _compensate_path(tool) is None:
            continue
        delivery = compensation_delivery(tool, effect.key, effect.external_reference)
        compensation = compensation_begin(conn, effect, delivery)
        begun.append({"key": compensation.key, "status": compensation.status.value})
    return begun
