"""The sandbox reaper: destroys what killed workers left on this host.

It runs once when a worker starts, before DBOS recovers any run (so a resumed command never
races the container of its previous attempt), and then every `sandbox_reap_interval_s`, which
also catches the sandboxes of runs cancelled from outside (they stop without running their
destroy step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ledgerloop.agent.act_sandbox import run_status, sandbox_host
from ledgerloop.runtime import Runtime

log = logging.getLogger(__name__)


async def reap_sandboxes(runtime: Runtime) -> list[str]:
    host = sandbox_host(runtime.settings.sandboxes)
    if not host.ids():
        return []
    destroyed = await host.reap(run_status)
    if destroyed:
        log.info("sandbox reaper destroyed %d sandboxes: %s", len(destroyed), destroyed)
    return destroyed


async def sandbox_reaper(runtime: Runtime, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), runtime.settings.sandbox_reap_interval_s)
        if stop.is_set():
            return
        try:
            await reap_sandboxes(runtime)
        except Exception:
            log.exception("sandbox reaper failed; trying again next round")
