"""The database goes away: runs in flight survive a 30 s outage, and processes started while
it is down come up when it returns. A private cluster, stopped and started; real processes."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.connect import connect
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import (
    REPO,
    start_relay,
    start_worker,
    stop_worker,
    worker_env,
)
from tests.conftest import start_test_run
from tests.support.clusters import migrated_database

pytestmark = pytest.mark.crash

#: The test agents' write tools are in the test policy (a worker refuses unlisted ones).
TEST_POLICY = str(REPO / "tests" / "support" / "policy.yaml")

OUTAGE_S = 30.0

#: Three tool turns, each answer a little slow, so the runs are mid-flight when the database
#: goes: some in a think step, some in a tool or memory step, some between steps.
SCRIPT = """
default:
  turns:
    - {tool_use: {name: echo, input: {text: one}}, delay_ms: 700}
    - {tool_use: {name: echo, input: {text: two}}, delay_ms: 700}
    - {tool_use: {name: echo, input: {text: three}}, delay_ms: 700}
    - {text: done, delay_ms: 300}
"""


def _looper_env(url: str, model_url: str, **extra: str) -> dict[str, str]:
    return worker_env(
        url,
        ANTHROPIC_BASE_URL=model_url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=TEST_POLICY,
        **extra,
    )


def _runs_under_way(url: str, n: int, what: str) -> list[Any]:
    """Start `n` looper runs and wait until each is past memory-load."""
    with connect(url, autocommit=True) as conn:
        run_ids = [start_test_run(conn, "looper", f"{what} {i}") for i in range(n)]
        wait_until(
            lambda: all(run_require(conn, r).status is not RunStatus.RECEIVED for r in run_ids),
            timeout=30,
        )
    return run_ids


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


@pytest.mark.timeout(300)
def test_a_30_second_outage_mid_run_fails_no_run(
    cluster: LocalCluster, scripted_model: Any, tmp_path: Path
) -> None:
    url = migrated_database(cluster)
    model = scripted_model(SCRIPT)
    log = tmp_path / "worker.log"
    worker = start_worker(_looper_env(url, model.url), log=log)
    try:
        # Every run is under way before the database goes.
        run_ids = _runs_under_way(url, 6, "outage")
        cluster.stop(mode="fast")  # every connection is cut
        time.sleep(OUTAGE_S)  # the outage itself, not a wait for a condition
        assert worker.poll() is None, log.read_text()
        cluster.start()
        with connect(url, autocommit=True) as conn:

            def all_done() -> list[Any] | None:
                runs = [run_require(conn, r) for r in run_ids]
                return runs if all(r.status in TERMINAL for r in runs) else None

            # DBOS's own retries back off from 1 s doubling to 60 s (with jitter): a run
            # blocked in one resumes within about the outage's length after the return.
            try:
                runs = wait_until(all_done, timeout=120)
            except AssertionError:
                states = [(r, run_require(conn, r).status.value) for r in run_ids]
                raise AssertionError(
                    f"runs not ended: {states}\n{log.read_text()[-20000:]}"
                ) from None
        assert isinstance(runs, list)
        assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * len(run_ids), [
            r.state for r in runs
        ]
        assert worker.poll() is None, log.read_text()
        # Each model turn was paid for once per run: no think step ran twice.
        assert len(model.requests()) == 4 * len(run_ids)
    finally:
        stop_worker(worker)


def test_worker_and_relay_started_while_the_database_is_down_come_up_when_it_returns(
    cluster: LocalCluster, scripted_model: Any, tmp_path: Path
) -> None:
    url = migrated_database(cluster)
    model = scripted_model("default: {turns: [{text: done}]}")
    cluster.stop(mode="fast")
    env = _looper_env(url, model.url, LEDGERLOOP_STARTUP_WAIT_S="60")
    worker_log, relay_log = tmp_path / "worker.log", tmp_path / "relay.log"
    worker = start_worker(env, log=worker_log)
    relay = start_relay(env, log=relay_log)
    try:
        for log in (worker_log, relay_log):
            wait_until(lambda log=log: _log_has(log, "unreachable"), timeout=90)
        assert worker.poll() is None
        assert relay.poll() is None
        # Said once, not once per attempt; and the relay did not claim to be up.
        assert worker_log.read_text().count("unreachable") == 1
        assert not _log_has(relay_log, "relay up")
        cluster.start()
        wait_until(lambda: _log_has(worker_log, "reachable again"), timeout=60)
        wait_until(lambda: re.search(r"ledgerloop worker \S+ up", worker_log.read_text()), 60)
        wait_until(lambda: _log_has(relay_log, "relay up"), timeout=60)
        with connect(url, autocommit=True) as conn:
            run_id = start_test_run(conn, "looper", "after the failover")
            wait_until(lambda: run_require(conn, run_id).status is RunStatus.SUCCEEDED, 30)
    finally:
        stop_worker(worker)
        stop_worker(relay)


def test_relay_and_reconciler_that_start_as_the_database_goes_connect_when_it_returns(
    cluster: LocalCluster,
) -> None:
    """Inside `ledgerloop up` they start a moment after the worker found the database; an
    outage that begins in that moment once ended the relay, and the worker with it."""
    from ledgerloop.effects.attempts import RelayConfig
    from ledgerloop.effects.reconciler import Reconciler
    from ledgerloop.effects.relay import Relay

    url = migrated_database(cluster)
    cluster.stop(mode="fast")

    async def scenario() -> None:
        stop = asyncio.Event()
        config = RelayConfig(reconnect_s=0.2)
        async with Relay(url, {}, config) as relay, Reconciler(url, {}) as reconciler:
            relaying = asyncio.create_task(relay.run(stop))
            reconciling = asyncio.create_task(reconciler.run(stop, interval_s=0.2))
            await asyncio.sleep(1.0)
            assert not relaying.done()
            assert not reconciling.done()
            await asyncio.to_thread(cluster.start)
            # A claim pass and the listener both succeeded: the relay is connected again.
            await asyncio.wait_for(relay.listening.wait(), 30)
            await asyncio.wait_for(relay.idle.wait(), 30)
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert await reconciler.reconcile_once() == 0
                    break
                except LedgerloopError:
                    assert time.monotonic() < deadline, "the reconciler never reconnected"
                    await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(relaying, reconciling)

    asyncio.run(scenario())


def test_the_http_api_that_starts_as_the_database_goes_serves_when_it_returns(
    cluster: LocalCluster,
) -> None:
    import httpx

    from ledgerloop.http.app import create_app
    from ledgerloop.http.server import listen, run_server

    url = migrated_database(cluster)
    cluster.stop(mode="fast")

    async def scenario() -> None:
        stop = asyncio.Event()
        sock = listen("127.0.0.1", 0)
        port = sock.getsockname()[1]
        app = create_app(url, agent_names=["looper"])
        serving = asyncio.create_task(run_server(app, sock, stop, wait_for_database=True))
        await asyncio.sleep(1.5)
        assert not serving.done()  # waiting, not failed
        await asyncio.to_thread(cluster.start)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    response = await client.get("/healthz")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the API never started serving"
                    await asyncio.sleep(0.2)
        assert response.status_code == 200
        stop.set()
        await serving

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_worker_told_to_stop_during_an_outage_exits(
    cluster: LocalCluster, scripted_model: Any, tmp_path: Path
) -> None:
    """Its DBOS threads retry their statements until the database returns; the process must
    not wait for them, or a supervisor would never restart it."""
    url = migrated_database(cluster)
    model = scripted_model(SCRIPT)
    log = tmp_path / "worker.log"
    worker = start_worker(_looper_env(url, model.url, LEDGERLOOP_DRAIN_S="1"), log=log)
    try:
        _runs_under_way(url, 4, "stopped")
        cluster.stop(mode="fast")
        time.sleep(1.0)  # every DBOS thread meets the outage and starts its retries
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the worker did not exit within 40 s of SIGTERM:\n{log.read_text()[-5000:]}"
            )
        took = time.monotonic() - stopped_at
        assert took < 30, f"exited only after {took:.0f} s"
    finally:
        stop_worker(worker)


def test_a_bounded_wait_gives_up_with_one_clear_error() -> None:
    from ledgerloop.db.cluster import free_port
    from ledgerloop.db.errors import DatabaseUnreachable
    from ledgerloop.db.wait import wait_for_database

    said: list[str] = []
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    with pytest.raises(DatabaseUnreachable) as info:
        wait_for_database(url, 1.0, said.append)
    assert "gave up after waiting 1 s" in str(info.value)
    assert "LEDGERLOOP_STARTUP_WAIT_S" in str(info.value)
    assert len(said) == 1  # announced once, not once per attempt
