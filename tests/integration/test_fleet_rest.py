"""A resting worker (fleet/heartbeat.py): it writes nothing while idle, peers judge it by its
heartbeat session's advisory lock, and a wanted lease wakes it. Time is moved in the
database (rows written into the past) or on the heartbeat's own clock, never slept through.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledgerloop.db.connect import Conn, connect
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.heartbeat import LOCK_NAMESPACE, FleetTimings, Heartbeat
from ledgerloop.testing.postgres import wait_until

TIMINGS = FleetTimings(heartbeat_s=0.5, stale_after_s=5.0)


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def me(db_url: str, clock: list[float]) -> Iterator[Heartbeat]:
    fence = Fence(TIMINGS.lease_s, clock=lambda: clock[0])
    heartbeat = Heartbeat(db_url, "me", "v1", TIMINGS, fence, clock=lambda: clock[0])
    heartbeat.register()
    # A judge: its session began a minute ago, its streak too.
    row = heartbeat._connection().execute("SELECT now() - interval '60 s' AS t").fetchone()
    assert row is not None
    heartbeat._session_since = row["t"]
    yield heartbeat
    heartbeat.stop()


def judge(conn: Conn) -> None:
    """`me` heartbeated just now, on a streak a minute long: it may judge."""
    conn.execute(
        "UPDATE ledgerloop.executor SET heartbeat_at = now(),"
        " streak_started_at = now() - interval '60 s' WHERE id = 'me'"
    )


def resting_peer(conn: Conn, lock_key: int, runs: int = 0) -> None:
    """A peer that rested long ago: its heartbeat and lease a minute old."""
    conn.execute(
        "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, lock_key,"
        " heartbeat_at, lease_until, resting_since) VALUES ('resting', 'v1', 'elsewhere', 1,"
        " %s, now() - interval '60 s', now() - interval '59 s', now() - interval '60 s')",
        (lock_key,),
    )
    conn.execute(
        "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, executor_id)"
        " SELECT 'resting-' || i, 'PENDING', 'ledgerloop_run', 'ledgerloop_runs', 'resting'"
        " FROM generate_series(1, %s) i",
        (runs,),
    )


def rows(conn: Conn) -> set[str]:
    return {r["id"] for r in conn.execute("SELECT id FROM ledgerloop.executor").fetchall()}


def test_a_resting_peer_whose_session_holds_its_lock_is_alive_however_old(
    conn: Conn, me: Heartbeat
) -> None:
    resting_peer(conn, lock_key=21)
    judge(conn)
    with connect(me.url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, 21)", (LOCK_NAMESPACE,))
        assert me.tick() == []
        assert rows(conn) == {"me", "resting"}
        assert me.peers == 1  # a live peer a burst can be shared with
        assert me.beating == 0  # which holds no runs: a resting worker need not watch it


def test_a_resting_peer_whose_session_is_gone_is_taken_over(conn: Conn, me: Heartbeat) -> None:
    resting_peer(conn, lock_key=22, runs=2)
    # (The server must have been up for stale_after_s: a restart frees every lock.)
    wait_until(
        lambda: conn.execute(
            "SELECT pg_postmaster_start_time() < now() - interval '6 s' AS up"
        ).fetchone()["up"],
        timeout=10,
    )
    judge(conn)
    (taken,) = me.tick()
    assert (taken.executor_id, taken.runs) == ("resting", 2)
    assert taken.silent_s >= 60
    assert rows(conn) == {"me"}


def test_an_idle_worker_rests_writes_nothing_and_wakes_when_a_lease_is_wanted(
    conn: Conn, me: Heartbeat, clock: list[float]
) -> None:
    def row() -> dict[str, object]:
        found = conn.execute(
            "SELECT xmin::text AS version, resting_since IS NOT NULL AS resting"
            " FROM ledgerloop.executor WHERE id = 'me'"
        ).fetchone()
        assert found is not None
        return dict(found)

    me.tick()
    assert not me.resting  # executed nothing, but not yet for stale_after_s
    clock[0] += TIMINGS.stale_after_s
    me.tick()  # a heartbeat, then the rest
    assert me.resting
    assert me.fence.resting
    rested = row()
    assert rested["resting"]
    clock[0] += TIMINGS.lease_s + 0.01
    assert not me.fence.valid()  # no lease is renewed while it rests
    for _ in range(3):
        assert me.tick() == []  # a watch: its row is not written
    assert row() == rested
    me.fence.want()  # a claim, step or checkpoint asks for a lease
    me.tick()
    assert not me.resting
    assert me.fence.valid()
    assert not me.fence.wanted
    woke = row()
    assert not woke["resting"]
    assert woke["version"] != rested["version"]
