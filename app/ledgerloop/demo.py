"""`ledgerloop demo`: the ops agent end to end on whatever is (or is not) configured.

With nothing configured it uses the embedded Postgres and the scripted model, and it always
brings its own ticket service. The run searches the runbooks, proposes a ticket, waits for an
approval bound to that exact ticket, files it exactly once through the outbox and the relay,
and answers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerloop.agent.definition import EXAMPLE_AGENT_MODULE
from ledgerloop.config import Settings
from ledgerloop.db.connect import connect
from ledgerloop.db.migrate import upgrade
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import Run, run_events, run_require

DEMO_MESSAGE = "db-1 is out of disk space and writes are failing. What should we do?"

#: The examples' tool policy, shipped in the package (a copy of the repository's
#: tool_policy.yaml): an installed package has no checkout to find the file in.
EXAMPLE_POLICY = Path(__file__).parent / "examples" / "tool_policy.yaml"


def demo_policy(settings: Settings) -> Path | None:
    """The examples' policy when the configured one is the default name and the current
    directory has no such file (a `pip install`ed package run anywhere); else None."""
    default = Settings.model_fields["policy_file"].default
    if settings.policy_file == default and not settings.policy_file.exists():
        return EXAMPLE_POLICY
    return None


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_demo(settings: Settings, url: str, say: Callable[[str], None]) -> Run:
    from ledgerloop.approvals.principals import principal_create
    from ledgerloop.approvals.store import approval_decide, approval_list
    from ledgerloop.examples.ticket_service import TicketServiceThread
    from ledgerloop.models.script import OPS_DEMO_SCRIPT, load_script
    from ledgerloop.models.scripted_server import ScriptedModelServer
    from ledgerloop.runs.start import start_run
    from ledgerloop.services import build_services
    from ledgerloop.testing.worker import WorkerThread
    from ledgerloop.worker import WorkerOptions

    changed = upgrade(url)
    say("schema installed" if changed else "schema already current")
    model: ScriptedModelServer | None = None
    overrides: dict[str, Any] = {}
    if not settings.anthropic_api_key:
        model = ScriptedModelServer(load_script(OPS_DEMO_SCRIPT)).start()
        overrides["anthropic_base_url"] = model.url
        say(f"no ANTHROPIC_API_KEY: scripted model at {model.url}")
    tickets = TicketServiceThread()
    tickets.start()
    say(f"ticket service at {tickets.url}")
    overrides["destinations"] = {**settings.destinations, "tickets": tickets.url}
    # The demo runs the example agent, which a worker loads only when asked to.
    overrides["agent_modules"] = tuple(
        dict.fromkeys((EXAMPLE_AGENT_MODULE, *settings.agent_modules))
    )
    if (policy := demo_policy(settings)) is not None:
        overrides["policy_file"] = policy
        say(f"no {settings.policy_file} here: the examples' policy {policy}")
    settings = settings.model_copy(update=overrides)
    options = WorkerOptions(services=build_services(settings, http=False, relay=True))
    try:
        with WorkerThread(settings, url, options), connect(url, autocommit=True) as conn:
            approver, _ = principal_create(
                conn, name=f"demo-approver-{uuid.uuid4().hex[:6]}", roles=["approver"]
            )
            run_id = start_run(conn, agent="ops", input={"message": DEMO_MESSAGE})
            say(f"run {run_id} started: {DEMO_MESSAGE!r}")
            approval = _wait(
                lambda: (
                    next(iter(approval_list(conn, run_id=run_id, status="pending")), None)
                    or (run_require(conn, run_id).status in TERMINAL and "done")
                ),
                60,
                "the approval request",
            )
            if approval != "done":
                say(f"waiting for approval: {approval.preview.get('summary')}")
                for line in approval.preview.get("lines", []):
                    say(f"    {line}")
                say(f"  action hash {approval.action_hash}")
                approval_decide(
                    conn,
                    approval_id=approval.id,
                    principal=approver,
                    decision="approve",
                    reason="demo",
                )
                say(f"approved by {approver.name}")
            run: Run = _wait(
                lambda: (r := run_require(conn, run_id)).status in TERMINAL and r, 120, "the run"
            )
            say("timeline:")
            for event in run_events(conn, run_id):
                say(f"  {event.sequence:>2} {event.event_type}")
            say(f"run {run.status.value}: {run.state.get('answer') or run.state.get('reason')}")
            import httpx

            created = httpx.get(f"{tickets.url}/_stats").json()["created"]
            say(f"tickets filed: {created}")
            return run
    finally:
        tickets.stop()
        if model:
            model.stop()


def demo_succeeded(run: Run) -> bool:
    return run.status is RunStatus.SUCCEEDED
