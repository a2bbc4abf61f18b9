"""A worker process: DBOS with the agent workflow, heartbeats and recovery (and, when asked,
the relay, the reconciler and the HTTP API). `ledgerloop up` runs one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ledgerloop.agent.definition import agents, load_agent_modules
from ledgerloop.config import Settings
from ledgerloop.db.connect import make_pool
from ledgerloop.db.migrate import ensure_current
from ledgerloop.errors import ConfigError
from ledgerloop.models.client import make_model_client
from ledgerloop.recovery import executor_register, executor_unregister, heartbeat_and_recover
from ledgerloop.runtime import Runtime, install
from ledgerloop.tools.policy import PolicyFile, load_policy

log = logging.getLogger(__name__)


@dataclass
class WorkerOptions:
    trace_console: bool = False
    #: Extra services started beside the workflow executor (relay, reconciler, HTTP...).
    services: list[Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]] = field(
        default_factory=list
    )


def check_policy_tools(policy: PolicyFile) -> None:
    """A policy entry for a tool no agent has is almost always a typo: refuse it."""
    known = {tool.name for agent in agents().values() for tool in agent.tools}
    unknown = sorted(set(policy.tools) - known)
    if unknown:
        raise ConfigError(
            f"tool_policy.yaml names tools no agent has: {', '.join(unknown)}",
            fix=f"known tools: {', '.join(sorted(known)) or 'none'}",
        )


def prepare(settings: Settings, url: str, *, trace_console: bool = False) -> Runtime:
    """Everything that can fail on bad configuration, checked before anything starts."""
    from ledgerloop.telemetry import configure_telemetry

    load_agent_modules(settings.agent_modules)
    policy = load_policy(settings.policy_file)
    check_policy_tools(policy)
    model = make_model_client(settings)
    ensure_current(url)
    configure_telemetry(console=trace_console)
    pool = make_pool(url, min_size=2, max_size=20, name="ledgerloop-worker")
    return Runtime(settings=settings, database_url=url, pool=pool, model=model, policy=policy)


async def run_worker(
    settings: Settings,
    url: str,
    stop: asyncio.Event,
    options: WorkerOptions | None = None,
    ready: Callable[[Runtime], None] | None = None,
) -> None:
    from dbos import DBOS

    from ledgerloop.agent.loop import QUEUE_NAME

    options = options or WorkerOptions()
    runtime = prepare(settings, url, trace_console=options.trace_console)
    install(runtime)
    tasks: list[asyncio.Task[None]] = []
    failures: list[BaseException] = []

    def watch(task: asyncio.Task[None]) -> None:
        # A service that dies (the HTTP port is taken, say) stops the worker, and its error
        # becomes the worker's: `ledgerloop up` then exits with that one line, not 0.
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]
            stop.set()

    try:
        # Register before launching: a row that exists can never look like a dead executor
        # that had no chance to heartbeat.
        with runtime.pool.connection() as conn:
            executor_register(conn, settings.executor_id, settings.application_version)
        DBOS(config=settings.dbos_config(url))  # type: ignore[arg-type]
        DBOS.launch()
        await DBOS.register_queue_async(
            QUEUE_NAME,
            polling_interval_sec=settings.queue_poll_s,
            worker_concurrency=settings.worker_concurrency,
        )
        tasks.append(
            asyncio.create_task(
                heartbeat_and_recover(
                    runtime.pool, settings.executor_id, settings.application_version, stop
                )
            )
        )
        for service in options.services:
            tasks.append(asyncio.create_task(service(runtime, stop)))
        for task in tasks:
            task.add_done_callback(watch)
        if ready:
            ready(runtime)
        await stop.wait()
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            DBOS.destroy(destroy_registry=False)
        except Exception:
            # Its runs may still be executing: keep the executor row, so that once this
            # process is gone a survivor recovers them as it would after a crash.
            log.exception("DBOS.destroy failed")
        else:
            with runtime.pool.connection() as conn:
                executor_unregister(conn, settings.executor_id)
        await runtime.model.client.close()
        runtime.pool.close()
        install(None)
    if failures:
        raise failures[0]
