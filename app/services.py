"""The services `ledgerloop up` runs beside the workflow executor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from app.config import Settings
from app.runtime import Runtime

Service = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def build_services(settings: Settings, *, http: bool, relay: bool) -> list[Service]:
    services: list[Service] = []
    return services
