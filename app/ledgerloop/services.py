"""The services `ledgerloop up` runs beside the workflow executor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ledgerloop.config import Settings
from ledgerloop.runtime import Runtime

if TYPE_CHECKING:
    from ledgerloop.effects.attempts import RelayConfig

log = logging.getLogger(__name__)

Service = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def build_services(settings: Settings, *, http: bool, relay: bool) -> list[Service]:
    # Every worker sweeps: settling is a versioned transition, so runs are settled once; a
    # cancel request is taken by one worker (SKIP LOCKED).
    services: list[Service] = [sweeper_service, cancel_sweep_service]
    if http:
        # Imported only when serving: a worker started with --no-http never loads FastAPI.
        from ledgerloop.http.server import serve_http

        services.append(serve_http)
    if relay:
        services += [relay_service, reconciler_service]
    if settings.purge_journals_after is not None or settings.purge_runs_after is not None:
        from ledgerloop.retention.service import purge_service

        services.append(purge_service)
    return services


def listened_channels(*, http: bool, relay: bool) -> tuple[str, ...]:
    """The channels `ledgerloop up`'s services hear on the worker's shared listener."""
    from ledgerloop.effects.outbox import CHANNEL as OUTBOX
    from ledgerloop.streams.hub import CHANNEL as RUN_EVENTS

    return (*((OUTBOX,) if relay else ()), *((RUN_EVENTS,) if http else ()))


def relay_config(
    settings: Settings, *, listening: bool, step_connections: int | None = None
) -> RelayConfig:
    """The relay's configuration from the settings; without LISTEN (a transaction-mode
    pooler and no direct URL) it looks for due rows every LEDGERLOOP_POOLED_POLL_S.
    `step_connections`: the pool act steps record on (the worker's footprint)."""
    from ledgerloop.effects.attempts import RelayConfig

    config = RelayConfig(
        lease_margin_s=settings.relay_lease_margin_s,
        settle_after_s=settings.effect_settle_after_s,
    )
    if step_connections is not None:
        config = replace(config, step_connections=step_connections)
    if not listening:
        config = replace(config, safety_poll_s=min(config.safety_poll_s, settings.pooled_poll_s))
    return config


def destinations(runtime: Runtime) -> dict[str, str]:
    """Where write tools deliver: the policy file's map, overridden by the settings'."""
    return {**runtime.policy.destination_urls(), **runtime.settings.destinations}


async def relay_service(runtime: Runtime, stop: asyncio.Event) -> None:
    from ledgerloop.db.footprint import RELAY_STEPS
    from ledgerloop.db.pooling import session_url
    from ledgerloop.effects.relay import Relay

    listen_url = session_url(runtime.database_url)
    steps = runtime.footprint.pool(RELAY_STEPS) if runtime.footprint else None
    config = relay_config(
        runtime.settings, listening=listen_url is not None, step_connections=steps or None
    )
    async with Relay(
        runtime.database_url,
        destinations(runtime),
        config,
        runtime.policy.mcp_servers,
        listen_url=listen_url,
        # The worker's dispatcher hears the outbox: no LISTEN connection of the relay's own.
        # Without LISTEN anywhere the relay's own safety poll finds the rows (the shared
        # listener would wake it as often again).
        notifications=runtime.notifications if listen_url is not None else None,
    ) as relay:
        # This worker's act steps send their effects through it (settings.inline_delivery).
        if runtime.settings.inline_delivery:
            runtime.deliverer = relay
        try:
            await relay.run(stop)
        finally:
            runtime.deliverer = None


async def reconciler_service(runtime: Runtime, stop: asyncio.Event) -> None:
    from ledgerloop.effects.reconciler import run_reconciler

    await run_reconciler(
        runtime.database_url,
        destinations(runtime),
        stop=stop,
        interval_s=runtime.settings.reconcile_interval_s,
        mcp_servers=runtime.policy.mcp_servers,
    )


async def cancel_sweep_service(runtime: Runtime, stop: asyncio.Event) -> None:
    """Cancel, through DBOS, the workflows of cancelled runs whose requester did not."""
    from dbos import DBOS

    from ledgerloop.control.cancel import cancel_requests_settle
    from ledgerloop.idle import IdleBackoff

    interval = runtime.settings.cancel_sweep_s
    # A safety net (the requester cancels the workflow itself): slower while it finds none.
    backoff = IdleBackoff(interval)

    def sweep() -> int:
        with runtime.pool.connection() as conn:
            return cancel_requests_settle(conn, DBOS, settle_s=interval)

    while not stop.is_set():
        settled = 0
        try:
            settled = await asyncio.to_thread(sweep)
            if settled:
                log.info("cancelled the workflows of %d cancelled runs", settled)
        except Exception:
            log.exception("cancel sweep failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.after(settled > 0))


async def sweeper_service(runtime: Runtime, stop: asyncio.Event) -> None:
    from ledgerloop.agent.compensation_steps import compensations_begin
    from ledgerloop.control.sweeper import SweepConfig, run_sweeper

    settings = runtime.settings
    config = SweepConfig(
        interval_s=settings.sweep_interval_s,
        min_age_s=settings.sweep_min_age_s,
        deadline_grace_s=settings.sweep_deadline_grace_s,
        run_deadline_s=settings.run_deadline_s,
    )
    await run_sweeper(runtime.pool, config, stop, compensations_begin)
