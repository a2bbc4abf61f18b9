"""The sandbox path of the loop: a sandbox per (run, tool), made on first use, as steps.

    sandbox-create-{i}-{call_id}    working directory + files in           (a step)
    tool-{i}-{call_id}              one command in it, within the limits    (a step)
    sandbox-save-{i}-{call_id}-{n}  before an approval wait: /work -> payload, destroyed
    sandbox-restore-{i}-{call_id}   on the next use after a wait: payload -> /work
    sandbox-destroy-{n}             when the run ends (success, failure, cancel by the loop)

A run cancelled from outside stops at its next step without running any of these; the
reaper destroys its sandbox (its run is over). Commands run at least once: a worker killed
mid-command runs it again after the restart, in the same working directory.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ledgerloop.agent import steps
from ledgerloop.agent.context import RunContext
from ledgerloop.agent.definition import get_agent
from ledgerloop.agent.stepping import CODE_STEP, db_call, run_step
from ledgerloop.agent.steps import tool_result
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_get
from ledgerloop.runtime import get_runtime
from ledgerloop.sandbox import Limits, SandboxError, SandboxHost
from ledgerloop.telemetry import tool_span
from ledgerloop.tools.payloads import offload_if_large, payload_get, payload_id_for
from ledgerloop.tools.policy import ToolPolicy
from ledgerloop.tools.registry import Tool

#: A command step is not retried by DBOS on the guest's failures (those are results); an
#: infrastructure error (the backend vanished) is retried like any code step.
SANDBOX_STEP = CODE_STEP
#: Files returned inline up to this size; larger ones are offloaded payloads.
INLINE_FILE_CHARS = 2_000


@cache
def sandbox_host(root: Path) -> SandboxHost:
    return SandboxHost(root)


def current_host() -> SandboxHost:
    return sandbox_host(get_runtime().settings.sandboxes)


def limits_of(policy: ToolPolicy) -> Limits:
    limits = policy.limits
    return Limits(
        time_s=limits.time_s,
        memory_mb=limits.memory_mb,
        output_bytes=limits.output_kb * 1024,
        processes=limits.processes,
        file_mb=limits.file_mb,
    )


def _files_in(policy: ToolPolicy) -> dict[str, bytes]:
    files = {}
    for name, source in policy.files_in.items():
        try:
            files[name] = Path(source).read_bytes()
        except OSError as exc:
            raise SandboxError(
                f"files_in {name}: cannot read {source}: {exc}",
                fix="list host files the worker can read in the tool's files_in",
            ) from exc
    return files


# -- step bodies (at least once; idempotent) ------------------------------------------------


def create_sandbox(
    run_id: str, tool_name: str, sandbox_id: str, snapshot_id: str | None
) -> dict[str, Any]:
    """Make the sandbox (again, on a retry), from the policy's files or a saved snapshot."""
    rt = get_runtime()
    policy = rt.policy.for_tool(tool_name)
    snapshot = None
    if snapshot_id is not None:
        with rt.pool.connection() as conn:
            row = payload_get(conn, uuid.UUID(snapshot_id))
        if row is None:
            return {"error": f"the saved working directory {snapshot_id} is gone"}
        snapshot = base64.b64decode(row["content"])
    try:
        current_host().create(
            sandbox_id,
            run_id=run_id,
            backend=policy.sandbox_backend,
            files={} if snapshot is not None else _files_in(policy),
            read_only_paths=policy.read_only_paths,
            snapshot=snapshot,
        )
    except SandboxError as exc:
        return {"error": exc.one_line()}
    return {"sandbox_id": sandbox_id, "backend": policy.sandbox_backend}


async def run_in_sandbox(
    run_id: str,
    tenant_id: str,
    step_name: str,
    agent_name: str,
    tool_name: str,
    sandbox_id: str,
    call: dict[str, Any],
) -> dict[str, Any]:
    """One command; its output (offloaded when large) and the files it made are the result."""
    rt = get_runtime()
    call_id = str(call["id"])
    tool = _tool(agent_name, tool_name)
    policy = rt.policy.for_tool(tool_name)
    host = current_host()
    await asyncio.to_thread(
        steps.transition,
        run_id,
        RunStatus.EXECUTING.value,
        "executing",
        {"tool_call_id": call_id},
        step_name,  # one event per call, also when the run is already executing
    )
    with tool_span(
        tool_name, call_id, run_id=run_id, step_name=step_name, description=tool.description
    ) as span:
        try:
            args = tool.input_model.model_validate(call.get("input") or {})
        except ValidationError as exc:
            span.record_error("InvalidArguments", "arguments failed validation")
            return tool_result(call_id, f"invalid arguments for {tool_name}: {exc}", is_error=True)
        assert tool.command is not None
        command = tool.command(args)
        notes = []
        if not host.exists(sandbox_id):
            # Another host resumed the run, or the directory was removed: start afresh.
            create_sandbox(run_id, tool_name, sandbox_id, None)
            notes.append("the sandbox was recreated: files from earlier commands are gone")
        try:
            sandbox = host.get(sandbox_id)
            for name, text in command.files.items():
                host.put_file(sandbox, name, text.encode())
            outcome = await host.exec(sandbox, list(command.argv), limits_of(policy))
            files = host.collect(sandbox, policy.files_out, policy.limits.file_mb * 1024 * 1024)
        except SandboxError as exc:
            span.record_error(type(exc).__name__, exc.message)
            return tool_result(call_id, exc.one_line(), is_error=True)
        report: dict[str, Any] = outcome.to_json()
        if notes:
            report["notes"] = notes
        if outcome.timed_out:
            report["error"] = f"stopped after the time limit of {policy.limits.time_s:g}s"
        if files:
            report["files"] = await db_call(_store_files, run_id, tenant_id, call_id, files)
        text = json.dumps(report)
        offloaded = await db_call(
            offload_if_large,
            text,
            limit_bytes=rt.settings.payload_offload_bytes,
            run_id=uuid.UUID(run_id),
            tenant_id=uuid.UUID(tenant_id),
            tool_call_id=call_id,
        )
        failed = outcome.exit_code != 0 or outcome.timed_out
        if failed:
            span.record_error("CommandFailed", f"exit code {outcome.exit_code}")
        result = tool_result(call_id, offloaded.visible, is_error=failed)
        if offloaded.payload_id:
            result["payload_ref"] = offloaded.payload_id
        return result


def _store_files(
    conn: Conn, run_id: str, tenant_id: str, call_id: str, files: dict[str, bytes]
) -> list[dict[str, Any]]:
    listed = []
    for name, data in files.items():
        try:
            text, kind = data.decode("utf-8"), "sandbox_file"
        except UnicodeDecodeError:
            text, kind = base64.b64encode(data).decode(), "sandbox_file_base64"
        entry: dict[str, Any] = {"name": name, "bytes": len(data)}
        if kind == "sandbox_file" and len(text) <= INLINE_FILE_CHARS:
            entry["content"] = text
        else:
            stored = offload_if_large(
                conn,
                text,
                limit_bytes=0 if kind != "sandbox_file" else INLINE_FILE_CHARS,
                run_id=uuid.UUID(run_id),
                tenant_id=uuid.UUID(tenant_id),
                tool_call_id=f"{call_id}:file:{name}",
                kind=kind,
            )
            entry["payload_ref"] = stored.payload_id
        listed.append(entry)
    return listed


async def save_sandbox(
    run_id: str, tenant_id: str, tool_name: str, sandbox_id: str, tag: str
) -> dict[str, Any]:
    """Keep the working directory as a payload and destroy the sandbox (before a wait)."""
    rt = get_runtime()
    host = current_host()
    payload_key = f"sandbox:{sandbox_id}:{tag}"
    if not host.exists(sandbox_id):
        # A retry after the destroy: the snapshot was stored before it.
        return {"snapshot_id": str(payload_id_for(uuid.UUID(run_id), payload_key))}
    limit = rt.policy.for_tool(tool_name).limits.snapshot_mb * 1024 * 1024
    data = host.snapshot(host.get(sandbox_id), limit)
    stored = await db_call(
        offload_if_large,
        base64.b64encode(data).decode(),
        limit_bytes=0,
        run_id=uuid.UUID(run_id),
        tenant_id=uuid.UUID(tenant_id),
        tool_call_id=payload_key,
        kind="sandbox_snapshot",
    )
    await host.destroy(sandbox_id)
    return {"snapshot_id": stored.payload_id}


async def destroy_sandbox(sandbox_id: str) -> dict[str, Any]:
    return {"destroyed": await current_host().destroy(sandbox_id)}


def sandbox_id_for(run_id: str, tool_name: str, i: int, call_id: str) -> str:
    return f"{uuid.uuid5(uuid.UUID(run_id), f'sandbox:{tool_name}:{i}:{call_id}').hex}"


def _tool(agent_name: str, name: str) -> Tool:
    """The agent's own tool: two agents may each have a tool of the same name."""
    agent = get_agent(agent_name)
    tool = agent.tool(name) if agent is not None else None
    if tool is None:
        raise LookupError(f"agent {agent_name!r} has no tool {name!r} in this worker")
    return tool


def run_status(run_id: str) -> str | None:
    """For the reaper: the run's status, None when there is no such run."""
    try:
        key = uuid.UUID(run_id)
    except ValueError:
        return None
    with get_runtime().pool.connection() as conn:
        run = run_get(conn, key)
    return None if run is None else run.status.value


# -- orchestration (workflow code: deterministic, reads only step results) -------------------


async def act_sandbox(run: RunContext, i: int, call: dict[str, Any], tool: Tool) -> dict[str, Any]:
    """Steps `sandbox-create-{i}-{call_id}` (or `-restore-`) on first use, then
    `tool-{i}-{call_id}`: the tool's command in the run's sandbox; its tool result."""
    call_id = str(call["id"])
    live = run.sandboxes.get(tool.name)
    if live is None or "snapshot_id" in live:
        sandbox_id = sandbox_id_for(run.run_id, tool.name, i, call_id)
        snapshot_id = live["snapshot_id"] if live else None
        name = f"{run.scope}sandbox-{'restore' if snapshot_id else 'create'}-{i}-{call_id}"
        made: dict[str, Any] = await run_step(
            name, CODE_STEP, create_sandbox, run.run_id, tool.name, sandbox_id, snapshot_id
        )
        if "error" in made:
            return tool_result(call_id, made["error"], is_error=True)
        live = {"sandbox_id": sandbox_id, "tool": tool.name}
        run.sandboxes[tool.name] = live
    step_name = f"{run.scope}tool-{i}-{call_id}"
    result: dict[str, Any] = await run_step(
        step_name,
        SANDBOX_STEP,
        run_in_sandbox,
        run.run_id,
        run.tenant_id,
        step_name,
        run.agent.name,
        tool.name,
        live["sandbox_id"],
        call,
    )
    return result


async def suspend_sandboxes(run: RunContext, tag: str) -> None:
    """Before a long wait: each live sandbox becomes a payload, and no sandbox remains."""
    for n, (tool_name, live) in enumerate(sorted(run.sandboxes.items())):
        if "snapshot_id" in live:
            continue
        saved: dict[str, Any] = await run_step(
            f"sandbox-save-{tag}-{n}",
            CODE_STEP,
            save_sandbox,
            run.run_id,
            run.tenant_id,
            tool_name,
            live["sandbox_id"],
            tag,
        )
        run.sandboxes[tool_name] = {"snapshot_id": saved["snapshot_id"], "tool": tool_name}


async def destroy_sandboxes(run: RunContext) -> None:
    """When the run ends, whichever way the loop ends it."""
    for n, (_, live) in enumerate(sorted(run.sandboxes.items())):
        if "sandbox_id" in live:
            await run_step(f"sandbox-destroy-{n}", CODE_STEP, destroy_sandbox, live["sandbox_id"])
    run.sandboxes.clear()
