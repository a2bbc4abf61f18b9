"""The services `ledgerloop up` runs beside the workflow executor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from ledgerloop.config import Settings
from ledgerloop.runtime import Runtime

Service = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def build_services(settings: Settings, *, http: bool, relay: bool) -> list[Service]:
    services: list[Service] = []
    if http:
        # Imported only when serving: a worker started with --no-http never loads FastAPI.
        from ledgerloop.http.server import serve_http

        services.append(serve_http)
    if relay:
        services += [relay_service, reconciler_service]
    return services


def destinations(runtime: Runtime) -> dict[str, str]:
    """Where write tools deliver: the policy file's map, overridden by the settings'."""
    return {**runtime.policy.destinations, **runtime.settings.destinations}


async def relay_service(runtime: Runtime, stop: asyncio.Event) -> None:
    from ledgerloop.effects.relay import RelayConfig, run_relay

    config = RelayConfig(
        lease_margin_s=runtime.settings.relay_lease_margin_s,
        settle_after_s=runtime.settings.effect_settle_after_s,
    )
    await run_relay(runtime.database_url, destinations(runtime), stop=stop, config=config)


async def reconciler_service(runtime: Runtime, stop: asyncio.Event) -> None:
    from ledgerloop.effects.reconciler import run_reconciler

    await run_reconciler(
        runtime.database_url,
        destinations(runtime),
        stop=stop,
        interval_s=runtime.settings.reconcile_interval_s,
    )
