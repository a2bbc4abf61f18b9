"""`ledgerloop deploy adopt` and `ledgerloop deploy stop-incompatible`.

DBOS dequeues a workflow only on workers of its application version, so after a deploy to a
new version every run in flight waits for a worker of the old one. Adoption moves the runs
the new code can resume (checked again here, by replay, right before) to the new version;
the others stay on the old one, for old workers to drain, until an operator stops them with
`stop-incompatible`, which cancels each with the reason `incompatible_deploy` and where its
journal and the new code part ways.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from ledgerloop.config import Settings
from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.sql import load_queries
from ledgerloop.deploy.check import RunCheck, check_runs, in_flight_workflows, replay_runtime

Q = load_queries("ledgerloop.deploy")

#: A PENDING run is adopted only when its executor has not heartbeated for this long: a
#: slow or frozen old worker keeps its runs (it still owns them) well past any takeover.
ADOPT_STALE_S = 30.0

REASON = "incompatible_deploy"


@dataclass
class AdoptReport:
    target_version: str
    #: Runs now pinned to the target version (a worker of it resumes them).
    adopted: list[RunCheck] = field(default_factory=list)
    #: Runs the new code would not resume: left to old workers (or stop-incompatible).
    incompatible: list[RunCheck] = field(default_factory=list)
    #: Resumable runs left where they are: executing on a live old worker, or moved on since
    #: the check. `deploy adopt` again once old workers stop takes them.
    busy: list[RunCheck] = field(default_factory=list)
    #: In-flight runs already on the target version.
    current: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "target_version": self.target_version,
            "adopted": [c.run_id for c in self.adopted],
            "incompatible": [c.to_json() for c in self.incompatible],
            "busy": [c.to_json() for c in self.busy],
            "current": self.current,
        }


def workflows_adopt(conn: Conn, checks: list[RunCheck], to_version: str) -> set[str]:
    """Adopt the checked runs that are still as checked; returns the adopted run ids."""
    from ledgerloop.agent.loop import QUEUE_NAME

    if not checks:
        return set()
    # One transaction: a run adopted without its child episode would wait for it forever,
    # and a later adopt no longer looks at a run already on the target version.
    with conn.transaction():
        adopted = _adopt(conn, checks, to_version, QUEUE_NAME)
    return adopted


def _adopt(conn: Conn, checks: list[RunCheck], to_version: str, queue: str) -> set[str]:
    rows = conn.execute(
        Q["workflows_adopt"],
        {
            "ids": [c.run_id for c in checks],
            "statuses": [c.workflow_status for c in checks],
            "executors": [c.executor_id for c in checks],
            "last_ops": [c.last_op for c in checks],
            "to_version": to_version,
            "queue": queue,
            "stale_s": ADOPT_STALE_S,
        },
    ).fetchall()
    adopted = {row["workflow_uuid"] for row in rows}
    if adopted:
        conn.execute(
            Q["episodes_adopt"],
            {"ids": sorted(adopted), "to_version": to_version, "stale_s": ADOPT_STALE_S},
        )
    return adopted


async def _candidates(
    settings: Settings, client: Any, from_version: str | None, *, other_versions: bool
) -> tuple[list[RunCheck], int]:
    import asyncio

    flying = await asyncio.to_thread(in_flight_workflows, client)
    target = settings.application_version
    current = sum(1 for w in flying if w.app_version == target)
    chosen = [
        w
        for w in flying
        if (not other_versions or w.app_version != target)
        and (from_version is None or w.app_version == from_version)
    ]
    return await check_runs(client, chosen), current


async def deploy_adopt(
    settings: Settings, url: str, *, from_version: str | None = None
) -> AdoptReport:
    """Check the in-flight runs of other versions and adopt the resumable ones."""
    from ledgerloop.control.timeline import dbos_client

    report = AdoptReport(settings.application_version)
    client = dbos_client(url)
    try:
        async with replay_runtime(settings, url):
            checks, report.current = await _candidates(
                settings, client, from_version, other_versions=True
            )
    finally:
        client.destroy()
    resumable = [c for c in checks if c.verdict.resumable]
    report.incompatible = [c for c in checks if not c.verdict.resumable]
    with connect(url, autocommit=True) as conn:
        adopted = workflows_adopt(conn, resumable, settings.application_version)
    report.adopted = [c for c in resumable if c.run_id in adopted]
    report.busy = [c for c in resumable if c.run_id not in adopted]
    return report


@dataclass(frozen=True)
class Stopped:
    check: RunCheck
    #: False when the run had finished meanwhile (nothing to stop).
    stopped: bool


async def deploy_stop_incompatible(
    settings: Settings, url: str, *, requested_by: str, from_version: str | None = None
) -> list[Stopped]:
    """Cancel every in-flight run the new code would not resume, with the reason."""
    from ledgerloop.control.timeline import dbos_client

    client = dbos_client(url)
    try:
        async with replay_runtime(settings, url):
            checks, _ = await _candidates(settings, client, from_version, other_versions=False)
        results = []
        with connect(url, autocommit=True) as conn:
            for check in checks:
                if not check.verdict.resumable:
                    results.append(_stop(conn, client, check, settings, requested_by))
        return results
    finally:
        client.destroy()


def _stop(
    conn: Conn, client: Any, check: RunCheck, settings: Settings, requested_by: str
) -> Stopped:
    from ledgerloop.control.cancel import RunNotCancellable, cancel_run

    verdict = check.verdict
    try:
        cancel_run(
            conn,
            uuid.UUID(check.run_id),
            workflows=client,
            requested_by=requested_by,
            reason=REASON,
            details={
                "deploy_version": settings.application_version,
                "run_version": check.version,
                "diverges_at": verdict.step,
                "recorded_step": verdict.recorded,
                "new_step": verdict.expected,
                "explanation": verdict.reason,
            },
        )
    except RunNotCancellable:
        return Stopped(check, False)
    return Stopped(check, True)
