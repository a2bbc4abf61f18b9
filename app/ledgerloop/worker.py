"""A worker process: DBOS with the agent workflow, its heartbeat and takeovers, dispatch (and,
when asked, the relay, the reconciler and the HTTP API). `ledgerloop up` runs one.

Start: register (before DBOS launches, so the row can never look dead), launch DBOS with its
own queue thread off Ledgerloop's queue, start the heartbeat and the dispatcher. Stop (SIGTERM,
SIGINT): stop claiming, let step bodies under way finish (up to drain_s), stop DBOS, then hand
the runs still in flight back to the queue and remove the row, in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ledgerloop.agent import dbos_step_start
from ledgerloop.agent.definition import (
    Agent,
    agents,
    agents_from,
    load_agent_modules,
    schedules_from,
)
from ledgerloop.config import Settings
from ledgerloop.db import dbos_checkpoint, dbos_journal, pooling
from ledgerloop.db.capacity import check_room
from ledgerloop.db.connect import (
    TIMELINE_QUERY,
    guard_borrows,
    make_pool,
    watch_async_connections,
    watch_connections,
)
from ledgerloop.db.footprint import (
    DBOS_POOL,
    LEDGERLOOP_POOL,
    RELAY_STEPS,
    Footprint,
    minimum,
    name_executor,
)
from ledgerloop.db.migrate import ensure_current
from ledgerloop.db.url import validate_url
from ledgerloop.effects.delivery_guard import guard_deliveries
from ledgerloop.errors import ConfigError, LedgerloopError
from ledgerloop.fleet import dbos_internals
from ledgerloop.fleet.dispatch import Dispatcher
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.guard import borrow_guard
from ledgerloop.fleet.heartbeat import FleetTimings, Heartbeat, Rewind
from ledgerloop.mcptools.client import close_connections
from ledgerloop.models.client import make_model_client
from ledgerloop.models.limits import FleetLimiter, ModelLimits
from ledgerloop.runtime import Runtime, install
from ledgerloop.sandbox import require_backend
from ledgerloop.schedules.ticker import check_schedules, keep_schedules
from ledgerloop.tools.policy import SANDBOX_FIELDS, PolicyFile, load_policy
from ledgerloop.tools.policy_check import argument_problems
from ledgerloop.tools.registry import Tool, ToolKind

log = logging.getLogger(__name__)


@dataclass
class WorkerOptions:
    trace_console: bool = False
    #: Extra services started beside the workflow executor (relay, reconciler, HTTP...).
    services: list[Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]] = field(
        default_factory=list
    )
    #: The process's connections (db/footprint.py); default: a worker without the relay.
    footprint: Footprint | None = None
    #: Channels the services will subscribe to on the shared listener, LISTENed on from the
    #: start (`ledgerloop up`: the outbox for the relay, run events for the HTTP API).
    channels: tuple[str, ...] = ()


def check_policy_tools(
    policy: PolicyFile,
    modules: tuple[str, ...] = (),
    *,
    policy_file: object = "tool_policy.yaml",
    registered: Mapping[str, Agent] | None = None,
) -> None:
    """Fail closed: every write tool needs its rules written down (whether a person approves
    it is a decision, never a default), and an entry for a tool no agent has is almost always
    a typo, so both refuse to start the worker.

    `registered`: the agents to check (default: those this worker's `modules` register). An
    agent that some other import registered in the same process is not this worker's to
    refuse; if it ever runs here, an unlisted write tool of it needs an approval
    (PolicyFile.for_write_tool), so it stays closed."""
    own = (
        {agent.name: agent for agent in agents_from(modules)} if registered is None else registered
    )
    registered = agents() if registered is None else registered
    writes = {
        tool.name: agent.name
        for agent in own.values()
        for tool in agent.tools
        if tool.kind is ToolKind.WRITE
    }
    missing = policy.missing_write_tools(writes)
    if missing:
        named = ", ".join(f"{name} (agent {writes[name]})" for name in missing)
        raise ConfigError(
            f"{policy_file} has no entry for the write tool(s) {named}",
            fix=(
                f"add each under `tools:` in {policy_file}, saying at least whether it "
                "requires_approval (see docs/policy.md)"
            ),
        )
    tools = {tool.name: tool for agent in registered.values() for tool in agent.tools}
    wrong = argument_problems(
        policy, [tool for agent in own.values() for tool in agent.tools], policy_file
    )
    if wrong:
        raise ConfigError(
            "; ".join(wrong),
            fix="name the tool's arguments as its input model does (see docs/policy.md)",
        )
    check_mcp_servers(policy, modules)
    # MCP tools are known by their declaration (the server lists them only at run time).
    declared = {
        name
        for server in policy.mcp_servers.values()
        for name in (*server.read_tools, *server.write_tools)
    }
    known = set(tools) | declared
    unknown = sorted(set(policy.tools) - known)
    if unknown:
        raise ConfigError(
            f"{policy_file} names tools no agent has: {', '.join(unknown)}",
            fix=f"known tools: {', '.join(sorted(known)) or 'none'}; an example agent's tools "
            "need its module in LEDGERLOOP_AGENT_MODULES",
        )
    check_sandbox_tools(policy, tools)


def check_mcp_servers(policy: PolicyFile, modules: tuple[str, ...]) -> None:
    """Every MCP server an agent of this worker's modules names is configured; lookup tools
    are declared reads."""
    for agent in agents_from(modules):
        for name in agent.mcp_servers:
            if name not in policy.mcp_servers:
                known = ", ".join(sorted(policy.mcp_servers)) or "none"
                raise ConfigError(
                    f"agent {agent.name} uses MCP server {name!r}, which tool_policy.yaml "
                    f"does not configure (configured: {known})",
                    fix=f"add mcp_servers.{name} (transport, command or url) to the policy",
                )
    for server_name, server in policy.mcp_servers.items():
        for tool, write in server.write_tools.items():
            if write.lookup_tool and write.lookup_tool not in server.read_tools:
                raise ConfigError(
                    f"mcp_servers.{server_name}.write_tools.{tool}.lookup_tool "
                    f"{write.lookup_tool!r} is not one of the server's read_tools",
                    fix="list the lookup tool under read_tools (it must not change anything)",
                )


def check_sandbox_tools(policy: PolicyFile, tools: dict[str, Tool]) -> None:
    """Sandbox fields on other tools would be ignored: refuse them. A sandbox tool's backend
    must run here: refuse to start (with what to install) rather than fail its first call."""
    for name, tool in sorted(tools.items()):
        rules = policy.for_tool(name)
        if tool.kind is not ToolKind.SANDBOX:
            stray = sorted(SANDBOX_FIELDS & rules.model_fields_set)
            if stray:
                raise ConfigError(
                    f"tool_policy.yaml: tools.{name}: {', '.join(stray)} apply to sandbox "
                    f"tools only, and {name} is a {tool.kind} tool",
                    fix="remove them, or make the tool a sandbox tool (@sandbox_tool)",
                )
            continue
        require_backend(rules.sandbox_backend)
        for target, source in rules.files_in.items():
            if not Path(source).is_file():
                raise ConfigError(
                    f"tool_policy.yaml: tools.{name}.files_in.{target}: {source} is not a file",
                    fix="list host files the worker can read",
                )


def prepare(
    settings: Settings,
    url: str,
    *,
    trace_console: bool = False,
    footprint: Footprint | None = None,
) -> Runtime:
    """Everything that can fail on bad configuration, checked before anything starts: the
    policy, the schema, and room on the server for the process's connections."""
    from ledgerloop.telemetry import configure_telemetry, get_telemetry

    load_agent_modules(settings.agent_modules)
    policy = load_policy(settings.policy_file)
    check_policy_tools(policy, settings.agent_modules, policy_file=settings.policy_file)
    check_schedules(schedules_from(settings.agent_modules), agents())
    model = make_model_client(settings)
    footprint = footprint or settings.footprint(relay=False)
    # Before anything else connects: a server without room is one line, not a stalled pool.
    check_room(url, footprint, minimum(relay=footprint.pool(RELAY_STEPS) > 0))
    ensure_current(url)
    configure_telemetry(console=trace_console)
    if settings.model_prices:  # the cost metric's price table
        get_telemetry().prices = settings.model_prices
    pool = make_pool(
        url, min_size=2, max_size=footprint.pool(LEDGERLOOP_POOL), name="ledgerloop-worker"
    )
    limits = ModelLimits.from_settings(settings)
    if limits.per_minute:
        limiter = FleetLimiter(pool, limits)
        limiter.declare()
        model = replace(model, limiter=limiter)
    timings = FleetTimings(settings.heartbeat_s, settings.stale_after_s)
    return Runtime(
        settings=settings,
        database_url=url,
        pool=pool,
        model=model,
        policy=policy,
        fence=Fence(timings.lease_s),
        footprint=footprint,
    )


async def run_worker(
    settings: Settings,
    url: str,
    stop: asyncio.Event,
    options: WorkerOptions | None = None,
    ready: Callable[[Runtime], None] | None = None,
) -> None:
    from dbos import DBOS

    # Both register their workflows with DBOS, which must know them before it launches (a
    # child episode is resumed on its own, in whichever worker takes it over).
    from ledgerloop.agent import episodes  # noqa: F401
    from ledgerloop.agent.loop import QUEUE_NAME
    from ledgerloop.agent.sandbox_reaper import reap_sandboxes, sandbox_reaper

    options = options or WorkerOptions()
    # DBOS parses the URL with SQLAlchemy: several hosts must reach it in the query form.
    url = validate_url(url)
    # Every connection from here on is named `ledgerloop:<executor>:<part>`.
    name_executor(settings.executor_id)
    runtime = prepare(
        settings, url, trace_console=options.trace_console, footprint=options.footprint
    )
    shape = runtime.footprint
    assert shape is not None
    log.info("connections: %s (LEDGERLOOP_MAX_CONNECTIONS)", shape.describe())
    listen_url = pooling.session_url(url)
    install(runtime)
    tasks: list[asyncio.Task[None]] = []
    failures: list[BaseException] = []

    def watch(task: asyncio.Task[None]) -> None:
        # A service that dies (the HTTP port is taken, say) stops the worker, and its error
        # becomes the worker's: `ledgerloop up` then exits with that one line, not 0.
        if not task.cancelled() and (exc := task.exception()) is not None:
            if not stop.is_set():
                # Said here: the line `ledgerloop up` exits with comes only after the drain,
                # and does not name the service. A bug's traceback too, never a user error's.
                if isinstance(exc, LedgerloopError):
                    log.error("%s failed; stopping the worker: %s", task.get_name(), exc.one_line())
                else:
                    log.error("%s failed; stopping the worker", task.get_name(), exc_info=exc)
            failures.append(exc)
            stop.set()

    assert runtime.fence is not None
    timings = FleetTimings(settings.heartbeat_s, settings.stale_after_s)
    heartbeat = Heartbeat(
        url, settings.executor_id, settings.application_version, timings, runtime.fence
    )
    fence = runtime.fence
    # After a failed heartbeat no checkpoint is written until the rewind check has run
    # (fleet.heartbeat); bounded, so a worker cut off for good fails its writes as before.
    dbos_checkpoint.gate_writes(lambda: fence.wait_valid(timings.stale_after_s))
    dbos_checkpoint.forget_all()
    guard_borrows(borrow_guard(fence, timings.stale_after_s))
    heartbeat.on_rewind = _forget_rewound
    heartbeat.on_reconnect = _wake_waiters
    watch_connections(heartbeat.observe)
    watch_async_connections(_async_watch(heartbeat, fence, timings.stale_after_s))
    guard_deliveries(_delivery_guard(heartbeat, fence, timings.stale_after_s))
    dispatcher: Dispatcher | None = None
    launched = False
    say_route(settings, url)
    try:
        heartbeat.register()
        # Before DBOS recovers anything: a resumed command must not race its old container.
        await reap_sandboxes(runtime)
        # DBOS's waiters hear their notifications through the dispatcher's connection.
        dbos_internals.share_dbos_listener(listen_url is not None)
        config = settings.dbos_config(url, pool_size=shape.pool(DBOS_POOL))
        DBOS(config=config)  # type: ignore[arg-type]
        # DBOS's queue thread leaves Ledgerloop's queue alone: the dispatcher claims from it.
        DBOS.listen_queues([])
        dbos_internals.slow_background_jobs(settings.dispatch_fallback_s)
        # Before launch: the workflows DBOS recovers start their steps the same way.
        dbos_step_start.install()
        DBOS.launch()
        launched = True
        dbos_journal.install(runtime.pool)
        dbos_checkpoint.install(runtime.pool)
        # DBOS's own writes (a workflow's outcome, a message consumed) on a connection to a
        # promoted replica wait for the rewind check, as this worker's pools do.
        dbos_internals.watch_dbos_connections(
            _timeline_watch(heartbeat, fence, timings.stale_after_s), TIMELINE_QUERY
        )
        queue = await DBOS.register_queue_async(
            QUEUE_NAME, worker_concurrency=settings.worker_concurrency
        )
        dbos_internals.slow_internal_queue(settings.dispatch_fallback_s)
        dbos_internals.quiet_queue_manager()
        heartbeat.start()
        dispatcher = Dispatcher(
            url,
            queue,
            runtime.fence,
            batch=settings.dispatch_batch,
            fallback_s=settings.dispatch_fallback_s,
            peers=lambda: heartbeat.peers,
            listen_url=listen_url,
            poll_s=settings.pooled_poll_s,
            # DBOS's own listener is off (share_dbos_listener), or DBOS runs without LISTEN
            # behind the pooler (config.dbos_config): this connection hears DBOS's channels.
            relay_dbos_notifications=listen_url is not None,
            # Only channels someone hears: each notification wakes this thread.
            channels=options.channels,
        )
        dispatcher.start()
        runtime.dispatcher = dispatcher
        runtime.notifications = dispatcher
        tasks.append(asyncio.create_task(sandbox_reaper(runtime, stop), name="sandbox reaper"))
        schedules = schedules_from(settings.agent_modules)
        tasks.append(
            asyncio.create_task(keep_schedules(runtime.pool, schedules, stop), name="schedules")
        )
        for service in options.services:
            name = getattr(service, "__name__", "a service").removesuffix("_service")
            tasks.append(asyncio.create_task(service(runtime, stop), name=f"service {name}"))
        for task in tasks:
            task.add_done_callback(watch)
        if ready:
            ready(runtime)
        await stop.wait()
    finally:
        stop.set()
        if dispatcher is not None:
            dispatcher.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _drain(runtime, settings.drain_s)
        heartbeat.stop()
        destroyed = False
        try:
            if launched:
                DBOS.destroy(destroy_registry=False)
            destroyed = True
        except Exception as exc:
            # Its runs may still be executing: keep the executor row, so that once this
            # process is gone a survivor takes them over as it would after a crash.
            log.warning("stopping DBOS failed (%s); peers will take this worker's runs over", exc)
        runtime.fence.release()
        await close_connections()
        if destroyed:
            try:
                handed = heartbeat.unregister()
                log.info("stopped; %d runs in flight went back on the queue", handed)
            except Exception as exc:
                log.warning("could not hand runs back (%s); peers will take them over", exc)
        await runtime.model.close()
        runtime.pool.close()
        dbos_internals.share_dbos_listener(False)
        name_executor(None)
        dbos_checkpoint.gate_writes(None)
        guard_borrows(None)
        watch_connections(None)
        watch_async_connections(None)
        guard_deliveries(None)
        install(None)
    if failures:
        raise failures[0]


def _wake_waiters() -> None:
    """After a reconnection: notifications of messages sent meanwhile were not heard."""
    woken = dbos_internals.wake_all_message_waiters()
    if woken:
        log.info("woke %d message waits after a reconnection (notifications may be lost)", woken)


def _timeline_watch(
    heartbeat: Heartbeat, fence: Fence, wait_s: float
) -> Callable[[int | None], None]:
    """A new connection reached `timeline`: on another than the heartbeat's, wait (bounded)
    for the rewind check before the connection is used."""

    def watch(timeline: int | None) -> None:
        if heartbeat.observe_timeline(timeline):
            fence.wait_valid(wait_s)

    return watch


def _async_watch(
    heartbeat: Heartbeat, fence: Fence, wait_s: float
) -> Callable[[int | None], Awaitable[None]]:
    """`_timeline_watch` for the relay's and reconciler's connections, on the event loop."""

    async def watch(timeline: int | None) -> None:
        if heartbeat.observe_timeline(timeline):
            await fence.wait_valid_async(wait_s)

    return watch


def _delivery_guard(
    heartbeat: Heartbeat, fence: Fence, wait_s: float
) -> Callable[[int | None], Awaitable[bool]]:
    """Before a send (effects.delivery_guard.guard_deliveries): not while a failover's rewind check
    is pending, not from a claim made on another timeline than the database's now, not for
    an execution whose run that check sent back to the journal."""

    async def guard(timeline: int | None) -> bool:
        if not await fence.wait_valid_async(wait_s):
            return False
        owner = dbos_internals.execution_owner()
        if owner is not None and owner in fence.stale:
            return False
        known = heartbeat.timeline
        return timeline is None or known is None or timeline == known

    return guard


def _forget_rewound(rewind: Rewind) -> None:
    """The database lost these runs' recent past: drop the writes this process recorded ahead
    for them, so their resumed steps record and deliver by the journal the database holds."""
    from ledgerloop.agent.effect_record import forget_runs

    dropped = forget_runs(set(rewind.lost) | set(rewind.moved))
    if dropped:
        log.info("dropped %d writes recorded ahead that the database lost", dropped)


def say_route(settings: Settings, url: str) -> None:
    """One line at start when the database is reached through a transaction-mode pooler:
    what runs on the direct connection, or what a worker without one does instead."""
    route = pooling.route(url)
    if not route.pooled:
        return
    if route.direct_url is not None:
        log.info(
            "database through a transaction-mode pooler; LISTEN and session locks on the "
            "direct connection (LEDGERLOOP_DIRECT_DATABASE_URL)"
        )
        return
    log.warning(
        "database through a transaction-mode pooler and no LEDGERLOOP_DIRECT_DATABASE_URL: "
        "running without LISTEN, so queued runs start and awaited messages (approvals, "
        "effect outcomes) arrive up to %.1f s late (LEDGERLOOP_POOLED_POLL_S), and a dead "
        "worker is taken over after %.1f s of silence (LEDGERLOOP_STALE_AFTER_S)",
        settings.pooled_poll_s,
        settings.stale_after_s,
    )


async def _drain(runtime: Runtime, timeout_s: float) -> None:
    """Stop between steps: no new step body starts, the ones under way finish (bounded),
    then every execution here ends (cancelled where it waits). Nothing is recorded for a
    step that did not run; the runs go back on the queue when the row is removed."""
    fence = runtime.fence
    if fence is None:
        return
    fence.close()
    executing = len(fence.executions)
    if executing:
        log.info(
            "stopping: %d runs executing here; letting step bodies under way finish", executing
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while fence.active and loop.time() < deadline:
        await asyncio.sleep(0.02)
    if fence.active:
        log.info(
            "%d step bodies still running after %.0f s; they will run again elsewhere",
            fence.active,
            timeout_s,
        )
    tasks = list(fence.executions)
    dbos_internals.quiet_cancellations()
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
