"""What steps need at run time (pool, model client, policy, settings), set once per process.

DBOS calls workflow and step functions by name with JSON inputs, so they cannot be handed
these objects; they read them from here. A worker installs the runtime before it launches
DBOS and clears it on shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from psycopg_pool import ConnectionPool

from ledgerloop.config import Settings
from ledgerloop.db.connect import Conn
from ledgerloop.db.footprint import Footprint
from ledgerloop.effects.outbox import Deliverer
from ledgerloop.errors import LedgerloopError
from ledgerloop.fleet.fence import Fence
from ledgerloop.models.client import ModelClient
from ledgerloop.streams.source import NotificationSource
from ledgerloop.tools.policy import PolicyFile


class ClaimCounts(Protocol):
    #: Runs claimed, and the most one claim took.
    claimed: int
    largest_claim: int


@dataclass
class Runtime:
    settings: Settings
    database_url: str
    pool: ConnectionPool[Conn]
    model: ModelClient
    policy: PolicyFile
    #: The worker's fence: step bodies start only while it holds (None: no fleet, e.g. tools).
    fence: Fence | None = None
    #: The relay running in this worker, which act steps hand their effects to (None: the
    #: effects wait for a relay elsewhere; see docs/effects.md).
    deliverer: Deliverer | None = None
    #: The worker's dispatcher (fleet.dispatch), once it runs: tests read what it claimed.
    dispatcher: ClaimCounts | None = None
    #: The process's connections under LEDGERLOOP_MAX_CONNECTIONS (db/footprint.py).
    footprint: Footprint | None = None
    #: The process's one LISTEN connection (the dispatcher's), for the relay's outbox and
    #: the HTTP server's run streams; None before the dispatcher runs.
    notifications: NotificationSource | None = None


_runtime: Runtime | None = None


class NoRuntime(LedgerloopError):
    """No Ledgerloop worker runtime is installed in this process."""


def install(runtime: Runtime | None) -> None:
    global _runtime
    _runtime = runtime


def get_runtime() -> Runtime:
    if _runtime is None:
        raise NoRuntime(fix="start a worker (`ledgerloop up`) before running workflows")
    return _runtime
