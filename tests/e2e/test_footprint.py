"""A bounded footprint: one `ledgerloop up` under load stays within LEDGERLOOP_MAX_CONNECTIONS,
and a process that cannot get its connections says so in one line.

The connections are counted the way an operator would: in pg_stat_activity, by the
application_name every connection of the process carries (`ledgerloop:<executor>:<part>`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import worker_env
from tests.conftest import REPO, TICKET_SCRIPT
from tests.e2e.conftest import MakeToken, bearer

pytestmark = pytest.mark.e2e

RUNS = 6
SUBSCRIBERS = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class PeakSampler:
    """The most connections named `ledgerloop:<executor>:...` seen at once, sampled every
    20 ms from pg_stat_activity on a connection of the test's own."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.peak = 0
        self.parts: set[str] = set()
        self.executors: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            rows = self.conn.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE application_name LIKE 'ledgerloop:%'"
            ).fetchall()
            self.peak = max(self.peak, len(rows))
            for (name,) in rows:
                _, executor, part = name.split(":", 2)
                self.executors.add(executor)
                self.parts.add(part)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()


def _up(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", "up", *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _follow(client: httpx.Client, path: str, token: str, seen: list[str]) -> None:
    """An SSE subscriber: reads the run's stream to its end."""
    with client.stream("GET", path, headers=bearer(token), timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                seen.append(line.removeprefix("event:").strip())


def test_up_under_load_stays_within_its_cap(
    db_url: str, conn: Conn, make_token: MakeToken, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(TICKET_SCRIPT)
    port = _free_port()
    with TicketServiceThread() as tickets:
        env = worker_env(
            db_url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_HTTP_PORT=str(port),
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        )
        log = tmp_path / "up.log"
        with PeakSampler(db_url) as sampler:
            proc = _up(env, log)
            try:
                _drive(proc, log, port, make_token)
                # Still running: the count covers everything it opened under load.
                assert proc.poll() is None, log.read_text()
            finally:
                _stop(proc)
    assert proc.returncode == 0, log.read_text()
    print(f"peak connections of one ledgerloop up: {sampler.peak}")
    # Measured 12 with the defaults (cap 15); more than 15 means a part escaped the cap.
    assert sampler.peak <= 15, f"peak {sampler.peak} connections; parts {sorted(sampler.parts)}"
    assert sampler.peak >= 6, f"only {sampler.peak}: the sampler did not see the process"
    assert len(sampler.executors) == 1
    # One LISTEN connection for everything; no listener of DBOS's, the relay's or the API's.
    assert {"heartbeat", "listener", "worker", "dbos", "relay", "relay-recorder"} <= sampler.parts
    assert "reconciler" in sampler.parts
    assert not sampler.parts & {"stream-listen", "relay-listen", "http", "dispatch"}
    assert "connections: 15 of 15" in log.read_text()


def _drive(proc: subprocess.Popen[bytes], log: Path, port: int, make_token: MakeToken) -> None:
    runner = make_token("runner", "viewer")
    approver = make_token("approver")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return http.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=90)
        ids = []
        for i in range(RUNS):
            started = http.post(
                "/v1/runs",
                json={"agent": "ops", "input": {"message": f"disk full {i}"}},
                headers=bearer(runner),
            )
            assert started.status_code == 201, started.text
            ids.append(started.json()["id"])
        streams: list[list[str]] = [[] for _ in range(SUBSCRIBERS)]
        followers = [
            threading.Thread(
                target=_follow,
                args=(http, f"/v1/runs/{ids[i]}/events", runner, streams[i]),
                daemon=True,
            )
            for i in range(SUBSCRIBERS)
        ]
        for follower in followers:
            follower.start()

        def pending() -> list[dict[str, Any]]:
            body = http.get(
                "/v1/approvals", params={"status": "pending"}, headers=bearer(approver)
            ).json()
            return list(body["approvals"])

        decided: set[str] = set()
        while len(decided) < RUNS:
            waiting = wait_until(pending, timeout=120)
            for approval in waiting:
                if approval["id"] in decided:
                    continue
                answer = http.post(
                    f"/v1/approvals/{approval['id']}/decision",
                    json={"decision": "approve"},
                    headers=bearer(approver),
                )
                assert answer.status_code == 200, answer.text
                decided.add(approval["id"])

        def all_done() -> bool:
            statuses = [
                http.get(f"/v1/runs/{run_id}", headers=bearer(runner)).json()["status"]
                for run_id in ids
            ]
            assert "failed" not in statuses, statuses
            return all(status == "succeeded" for status in statuses)

        wait_until(all_done, timeout=180)
        for follower in followers:
            follower.join(60)
        for seen in streams:
            assert "run.finished" in seen, seen


@contextmanager
def _cluster(max_connections: int) -> Iterator[LocalCluster]:
    """A started cluster of its own with `max_connections`."""
    # Under /tmp, not pytest's private tmp_path: the cluster runs as another system user.
    with tempfile.TemporaryDirectory(prefix="ledgerloop-footprint-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.init()
        with (cluster.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"max_connections = {max_connections}\n")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.destroy()


def test_three_up_and_an_app_share_a_default_postgres(tmp_path: Path) -> None:
    with _cluster(100) as cluster:
        url = DatabaseFactory(cluster.url).create()
        ports = [_free_port() for _ in range(3)]
        procs = [
            _up(
                worker_env(
                    url, ANTHROPIC_BASE_URL="http://127.0.0.1:9", LEDGERLOOP_HTTP_PORT=str(p)
                ),
                tmp_path / f"up{i}.log",
            )
            for i, p in enumerate(ports)
        ]
        try:
            for i, port in enumerate(ports):

                def healthy(i: int = i, port: int = port) -> bool:
                    assert procs[i].poll() is None, (tmp_path / f"up{i}.log").read_text()
                    try:
                        return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                    except httpx.TransportError:
                        return False

                wait_until(healthy, timeout=120)
            status = subprocess.run(
                [sys.executable, "-m", "ledgerloop.cli", "db", "status"],
                env=worker_env(url),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0, status.stderr
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE application_name LIKE 'ledgerloop:%%'), "
                    "count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchone()
                assert row is not None
                ours, in_use = row
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                _stop(proc)
    assert ours <= 45
    # Room left for the application: max_connections 100, 3 kept for superusers.
    assert 100 - 3 - in_use >= 45, f"{in_use} connections in use"
    lines = status.stdout.splitlines()
    assert any(
        line.startswith("connections: ") and "of max_connections 100" in line for line in lines
    ), status.stdout
    # One line per process: each `up` by its executor.
    assert sum(1 for line in lines if line.startswith("  ") and ": " in line) >= 3, status.stdout


# -- refusals -------------------------------------------------------------------------------


def _refused(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    proc = _up(env, tmp_path / "refused.log", "--no-http", *args)
    try:
        code = proc.wait(120)
    finally:
        _stop(proc)
    text = (tmp_path / "refused.log").read_text()
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


def test_a_cap_below_the_minimum_is_refused(db_url: str, tmp_path: Path) -> None:
    env = worker_env(db_url, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    env["LEDGERLOOP_MAX_CONNECTIONS"] = "9"
    line = _refused(env, tmp_path)
    assert "LEDGERLOOP_MAX_CONNECTIONS is 9, below the 11 connections" in line
    assert "set LEDGERLOOP_MAX_CONNECTIONS to 11 or more" in line


def test_a_role_connection_limit_too_low_is_refused(
    db_url: str, conn: Conn, tmp_path: Path
) -> None:
    role = f"ll_small_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 5")
    dbname = conn.info.dbname
    conn.execute(f"GRANT ALL ON DATABASE {dbname} TO {role}")
    url = db_url.replace(f"//{conn.info.user}@", f"//{role}@", 1)
    assert url != db_url
    env = worker_env(url, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    try:
        line = _refused(env, tmp_path)
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
    assert f"role {role} has CONNECTION LIMIT 5" in line
    assert f"ALTER ROLE {role} CONNECTION LIMIT" in line


@pytest.fixture
def small_cluster() -> Iterator[str]:
    """A cluster of its own with max_connections 20: three `up` do not fit."""
    with _cluster(20) as cluster:
        yield DatabaseFactory(cluster.url).create()


def test_a_server_without_room_is_refused_and_too_many_clients_is_named(
    small_cluster: str, tmp_path: Path
) -> None:
    # Hold connections until fewer than the worker's 15 remain free.
    held = [psycopg.connect(small_cluster, autocommit=True) for _ in range(8)]
    try:
        env = worker_env(small_cluster, ANTHROPIC_BASE_URL="http://127.0.0.1:9")
        line = _refused(env, tmp_path)
        assert "free connections (max_connections 20" in line
        assert "raise max_connections" in line
        # Filled to the last slot, the server's own refusal is named, not "cannot reach".
        while True:
            try:
                held.append(psycopg.connect(small_cluster, autocommit=True))
            except psycopg.OperationalError:
                break
        full = _refused(env, tmp_path)
        assert "too many clients" in full or "reserved" in full, full
        assert "cannot reach" not in full
        assert "max_connections" in full
    finally:
        for held_conn in held:
            held_conn.close()
