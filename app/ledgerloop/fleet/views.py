"""What operators read about the fleet: the workers, and the runs that need a look."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.fleet")


@dataclass(frozen=True)
class Worker:
    id: str
    hostname: str
    pid: int
    application_version: str
    software_version: str
    started_at: datetime
    heartbeat_age_s: float
    runs_executing: int
    #: It rests (writes no heartbeat while idle) and its heartbeat session is held.
    resting: bool = False

    def alive(self, stale_after_s: float) -> bool:
        return self.resting or self.heartbeat_age_s < stale_after_s


@dataclass(frozen=True)
class StuckRun:
    run_id: uuid.UUID
    tenant_id: uuid.UUID
    agent: str
    run_status: str
    workflow_status: str | None
    executor_id: str | None
    application_version: str | None
    updated_at: datetime
    problem: str


def workers_list(conn: Conn) -> list[Worker]:
    return [Worker(**row) for row in conn.execute(Q["workers_list"]).fetchall()]


def runs_stuck(conn: Conn, *, stale_after_s: float, limit: int = 100) -> list[StuckRun]:
    """Runs whose run and workflow disagree, PENDING under a worker that is gone or silent,
    or ENQUEUED for a version no live worker runs."""
    rows = conn.execute(Q["runs_stuck"], {"stale_s": stale_after_s, "limit": limit}).fetchall()
    return [StuckRun(**row) for row in rows]
