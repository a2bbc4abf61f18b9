"""`ledgerloop deploy check`: would the code and policy of this process resume every run in
flight? Each in-flight run's journal (and a sample of recently finished ones) is replayed
(deploy/replay.py); nothing is written and no model or tool is called.

"This process's code and policy" is what is about to be deployed: the installed Ledgerloop
and agent modules (LEDGERLOOP_AGENT_MODULES), the policy file (LEDGERLOOP_POLICY_FILE or
--policy) and the settings (the application version the deploy pins included).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbos import DBOSClient

from ledgerloop.config import Settings
from ledgerloop.deploy.replay import Entry, ReplayError, Verdict, replay_journal
from ledgerloop.runtime import NoRuntime, Runtime, get_runtime, install

#: DBOS statuses of a run still in flight: executing, queued, or hibernated.
IN_FLIGHT = ["PENDING", "ENQUEUED", "DELAYED"]


@dataclass(frozen=True)
class RunCheck:
    run_id: str
    #: The application version the run's workflow is pinned to.
    version: str | None
    #: Its DBOS status (PENDING, ENQUEUED, DELAYED; SUCCESS for a sampled finished run).
    workflow_status: str
    executor_id: str | None
    verdict: Verdict
    #: The last operation id in its journal when checked (0: none).
    last_op: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "version": self.version,
            "workflow_status": self.workflow_status,
            "executor_id": self.executor_id,
            **self.verdict.to_json(),
        }


@dataclass
class CheckReport:
    #: The version this process runs as (the one a deploy would adopt runs into).
    target_version: str
    policy_version: str
    in_flight: list[RunCheck] = field(default_factory=list)
    finished: list[RunCheck] = field(default_factory=list)

    @property
    def blocked(self) -> list[RunCheck]:
        """In-flight runs the new code would not resume."""
        return [c for c in self.in_flight if not c.verdict.resumable]

    @property
    def finished_diverging(self) -> list[RunCheck]:
        return [c for c in self.finished if not c.verdict.resumable]

    def passed(self, *, strict: bool = False) -> bool:
        return not self.blocked and not (strict and self.finished_diverging)

    def to_json(self) -> dict[str, Any]:
        return {
            "target_version": self.target_version,
            "policy_version": self.policy_version,
            "in_flight": len(self.in_flight),
            "blocked": len(self.blocked),
            "finished_sampled": len(self.finished),
            "finished_diverging": len(self.finished_diverging),
            "runs": [c.to_json() for c in self.in_flight],
            "finished_runs": [c.to_json() for c in self.finished],
        }


@asynccontextmanager
async def replay_runtime(settings: Settings, url: str) -> AsyncIterator[Runtime]:
    """The runtime workflow code reads (settings, policy, agents), for replays only: its pool
    is small and its model client is never called."""
    from ledgerloop.agent.definition import load_agent_modules
    from ledgerloop.db.connect import make_pool
    from ledgerloop.models.client import make_model_client
    from ledgerloop.tools.policy import load_policy
    from ledgerloop.worker import check_policy_tools

    try:
        get_runtime()
    except NoRuntime:
        pass
    else:
        raise ReplayError(
            "a worker runs in this process; replays need a runtime of their own",
            fix="run `ledgerloop deploy check` as its own command",
        )
    load_agent_modules(settings.agent_modules)
    policy = load_policy(settings.policy_file)
    # The checks a worker of this code makes at start-up, on the same modules: a policy whose
    # workers would refuse to start (a write tool with no entry, say) fails the check.
    check_policy_tools(policy, settings.agent_modules, policy_file=settings.policy_file)
    if not settings.anthropic_api_key and not settings.anthropic_base_url:
        # No model is called by a replay; a check needs no model access.
        settings = settings.model_copy(update={"anthropic_base_url": "http://127.0.0.1:9"})
    model = make_model_client(settings)
    pool = make_pool(url, min_size=1, max_size=2, name="ledgerloop-deploy-check")
    runtime = Runtime(settings=settings, database_url=url, pool=pool, model=model, policy=policy)
    install(runtime)
    try:
        yield runtime
    finally:
        install(None)
        await model.close()
        pool.close()


def journal(client: DBOSClient, workflow_id: str) -> list[Entry]:
    return [Entry.from_step(step) for step in client.list_workflow_steps(workflow_id)]


async def check_runs(
    client: DBOSClient, statuses: list[Any], *, timeout_s: float = 10.0
) -> list[RunCheck]:
    """Replay each workflow (a DBOS WorkflowStatus) against this process's code."""
    from ledgerloop.agent.loop import ledgerloop_run

    checks = []
    for status in statuses:
        entries = await asyncio.to_thread(journal, client, status.workflow_id)
        inputs = status.input or {"args": (status.workflow_id,), "kwargs": {}}
        verdict = await replay_journal(
            ledgerloop_run,
            status.workflow_id,
            list(inputs["args"]),
            entries,
            timeout_s=timeout_s,
        )
        checks.append(
            RunCheck(
                status.workflow_id,
                status.app_version,
                str(status.status),
                status.executor_id,
                verdict,
                max((e.function_id for e in entries), default=0),
            )
        )
    return checks


def in_flight_workflows(client: DBOSClient, *, run_ids: list[uuid.UUID] | None = None) -> list[Any]:
    from ledgerloop.agent.loop import WORKFLOW_NAME

    return client.list_workflows(
        name=WORKFLOW_NAME,
        status=IN_FLIGHT,
        workflow_ids=[str(r) for r in run_ids] if run_ids else None,
        load_input=True,
        load_output=False,
    )


async def deploy_check(
    settings: Settings, url: str, *, sample: int = 20, timeout_s: float = 10.0
) -> CheckReport:
    """Replay every in-flight run and the `sample` most recently finished ones."""
    from ledgerloop.agent.loop import WORKFLOW_NAME
    from ledgerloop.control.timeline import dbos_client

    client = dbos_client(url)
    try:
        async with replay_runtime(settings, url) as runtime:
            report = CheckReport(settings.application_version, runtime.policy.version)
            flying = await asyncio.to_thread(in_flight_workflows, client)
            report.in_flight = await check_runs(client, flying, timeout_s=timeout_s)
            if sample > 0:
                done = await asyncio.to_thread(
                    lambda: client.list_workflows(
                        name=WORKFLOW_NAME,
                        status=["SUCCESS"],
                        sort_desc=True,
                        limit=sample,
                        load_input=True,
                        load_output=False,
                    )
                )
                report.finished = await check_runs(client, done, timeout_s=timeout_s)
            return report
    finally:
        client.destroy()


def policy_override(settings: Settings, policy: Path | None) -> Settings:
    """The settings with `--policy` in place of LEDGERLOOP_POLICY_FILE."""
    return settings if policy is None else settings.model_copy(update={"policy_file": policy})
