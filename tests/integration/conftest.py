"""Fixtures shared by the write-path tests: the ticket service and an in-process worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.services import build_services
from ledgerloop.testing.worker import WorkerThread
from ledgerloop.worker import WorkerOptions
from tests.conftest import REPO


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


@pytest.fixture
def worker(
    make_settings: Callable[..., Any], db_url: str, tickets: TicketServiceThread
) -> Iterator[Callable[..., WorkerThread]]:
    """`worker(model_url, relay=True, **settings)`: a worker with the test agents and policy,
    the relay and the reconciler (unless relay=False), delivering to `tickets`."""
    started: list[WorkerThread] = []

    def start(model_url: str, *, relay: bool = True, **overrides: Any) -> WorkerThread:
        settings = make_settings(
            **{
                "anthropic_base_url": model_url,
                "agent_modules": "tests.support.agents",
                "policy_file": REPO / "tests" / "support" / "policy.yaml",
                "destinations": {"tickets": tickets.url},
                "effect_settle_after_s": 0.2,
                "reconcile_interval_s": 0.2,
                "relay_lease_margin_s": 1.0,
                **overrides,
            }
        )
        options = WorkerOptions(services=build_services(settings, http=False, relay=relay))
        thread = WorkerThread(settings, db_url, options).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()
