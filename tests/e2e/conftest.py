"""A real HTTP server on the test's database: uvicorn in a thread, on an ephemeral port."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from ledgerloop.approvals.preview import render_preview
from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import Approval, approval_request
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.effects.hashing import request_hash
from ledgerloop.effects.ledger import Effect, effect_begin
from ledgerloop.effects.testing import act_event
from ledgerloop.http.app import create_app
from ledgerloop.http.server import listen, run_server
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require, run_transition
from ledgerloop.testing.postgres import wait_until

REPO = Path(__file__).resolve().parents[2]
#: Debian's Chromium (no browser can be downloaded here), driven by Playwright.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: The agents the test app knows (the factory takes names; no worker runs them here).
AGENTS = frozenset({"ops", "looper"})
TENANT_B = uuid.UUID("00000000-0000-0000-0000-00000000000b")


class ServerThread:
    """`with ServerThread(app) as server:` serves `app` at `server.url` until the block ends."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="ledgerloop-http", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await run_server(self.app, self.sock, self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.error = exc

    def _healthy(self) -> bool:
        if self.error is not None:
            raise self.error
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def __enter__(self) -> ServerThread:
        self._thread.start()
        wait_until(self._healthy, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the HTTP server did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per test module (the approval page's and the console's)."""
    if not CHROMIUM.exists():
        subprocess.run([REPO / "scripts" / "install-browser"], check=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


@pytest.fixture
def server(db_url: str) -> Iterator[ServerThread]:
    with ServerThread(create_app(db_url, agent_names=AGENTS)) as running:
        yield running


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


MakeToken = Callable[..., str]


@pytest.fixture
def make_token(conn: Conn) -> MakeToken:
    """A token for a new principal with `roles` in `tenant` (the default tenant unless given)."""

    def make(*roles: str, tenant: uuid.UUID = DEFAULT_TENANT, name: str = "") -> str:
        _, token = principal_create(
            conn, name=name or f"{'-'.join(roles)}@example.com", roles=roles, tenant_id=tenant
        )
        return token

    return make


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def run_awaiting_approval(
    conn: Conn,
    *,
    tenant: uuid.UUID = DEFAULT_TENANT,
    arguments: dict[str, Any] | None = None,
    expires_at: datetime | None = None,
) -> Approval:
    """A run (with its DBOS workflow, no worker) parked on one pending approval, as the agent
    loop leaves it: received -> planning -> awaiting_approval, then approval_request."""
    run_id = start_run(conn, agent="ops", input={"message": "db-1 disk full"}, tenant_id=tenant)
    run = run_require(conn, run_id)
    run = run_transition(conn, run, RunStatus.PLANNING, "planning", {"turn": 0}).run
    run_transition(conn, run, RunStatus.AWAITING_APPROVAL, "awaiting_approval", {"call": "c1"})
    args = arguments or {"title": "Disk full on db-1", "priority": "high"}
    return approval_request(
        conn,
        run_id=run_id,
        tenant_id=tenant,
        tool="write_ticket",
        tool_call_id="c1",
        action_hash=request_hash("write_ticket", args, "tickets", "v1"),
        preview=render_preview("write_ticket", args, {"summary": "Open ticket {title}"}),
        policy_version="v1",
        expires_at=expires_at,
    )


def parked_effect(conn: Conn, *, tenant: uuid.UUID = DEFAULT_TENANT) -> Effect:
    """A needs_human effect on a run with a DBOS workflow (what the reconciler leaves when a
    destination can neither be asked nor safely resent to)."""
    run_id = start_run(conn, agent="ops", input={"message": "open a ticket"}, tenant_id=tenant)
    args = {"title": "Disk full"}
    act_event(conn, run_id, f"{run_id}:c1", call_id="c1")
    effect = effect_begin(
        conn,
        key=f"{run_id}:c1",
        run_id=run_id,
        tenant_id=tenant,
        tool="write_ticket",
        request_hash=request_hash("write_ticket", args, "tickets", "v1"),
        destination="tickets",
        request={"path": "/tickets", "body": args},
    )
    # Test setup only: the reconciler's own path to needs_human needs a live destination.
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'needs_human' WHERE idempotency_key = %s",
        (effect.key,),
    )
    return effect
