"""The database goes away: runs in flight survive a 30 s outage, and processes started while
it is down come up when it returns. A private cluster, stopped and started; real processes."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.connect import connect
from ledgerloop.db.migrate import upgrade
from ledgerloop.db.url import with_database
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


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    # Under /tmp, not pytest's private tmp_path: the cluster runs as another system user.
    with tempfile.TemporaryDirectory(prefix="ledgerloop-outage-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.destroy()


def _database(cluster: LocalCluster) -> str:
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE ledgerloop")
    url = with_database(cluster.url, "ledgerloop")
    upgrade(url)
    return url


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


@pytest.mark.timeout(300)
def test_a_30_second_outage_mid_run_fails_no_run(
    cluster: LocalCluster, scripted_model: Any, tmp_path: Path
) -> None:
    url = _database(cluster)
    model = scripted_model(SCRIPT)
    log = tmp_path / "worker.log"
    env = worker_env(
        url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=TEST_POLICY,
    )
    worker = start_worker(env, log=log)
    try:
        with connect(url, autocommit=True) as conn:
            run_ids = [start_test_run(conn, "looper", f"outage {n}") for n in range(6)]
            # Every run is under way (past memory-load) before the database goes.
            wait_until(
                lambda: all(run_require(conn, r).status is not RunStatus.RECEIVED for r in run_ids),
                timeout=30,
            )
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
            runs = wait_until(all_done, timeout=120)
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
    url = _database(cluster)
    model = scripted_model("default: {turns: [{text: done}]}")
    cluster.stop(mode="fast")
    env = worker_env(
        url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=TEST_POLICY,
        LEDGERLOOP_STARTUP_WAIT_S="60",
    )
    worker_log, relay_log = tmp_path / "worker.log", tmp_path / "relay.log"
    worker = start_worker(env, log=worker_log)
    relay = start_relay(env, log=relay_log)
    try:
        for log in (worker_log, relay_log):
            wait_until(lambda log=log: _log_has(log, "unreachable"), timeout=30)
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
