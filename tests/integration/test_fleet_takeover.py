"""Heartbeats and takeovers against a real Postgres: who is dead, by whose judgement, and
that the takeover of a dead worker and all its runs is one conditional transaction.

Time is moved in the database (heartbeats written into the past), never slept through.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from ledgerloop.db.connect import Conn, connect
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.heartbeat import (
    LOCK_NAMESPACE,
    SESSION_MARGIN_S,
    FleetTimings,
    Heartbeat,
    Takeover,
)
from ledgerloop.testing.postgres import wait_until
from tests.conftest import listen_url

TIMINGS = FleetTimings(heartbeat_s=0.5, stale_after_s=5.0)


def make_heartbeat(db_url: str, name: str) -> Heartbeat:
    return Heartbeat(db_url, name, "v1", TIMINGS, Fence(TIMINGS.lease_s))


def session_began(heartbeat: Heartbeat, seconds_ago: float) -> None:
    """As if `heartbeat`'s own database session had begun `seconds_ago` (peers' heartbeats
    written into the past must come after it for a free lock to count)."""
    row = (
        heartbeat._connection()
        .execute("SELECT now() - make_interval(secs => %s) AS since", (seconds_ago,))
        .fetchone()
    )
    assert row is not None
    heartbeat._session_since = row["since"]


@pytest.fixture
def me(db_url: str) -> Iterator[Heartbeat]:
    heartbeat = make_heartbeat(db_url, "me")
    heartbeat.register()
    session_began(heartbeat, 60)
    yield heartbeat
    heartbeat.stop()


def age(conn: Conn, executor_id: str, heartbeat_s: float, streak_s: float = 60) -> None:
    """Move an executor's last heartbeat and the start of its streak into the past."""
    conn.execute(
        "UPDATE ledgerloop.executor SET heartbeat_at = now() - make_interval(secs => %s),"
        " streak_started_at = now() - make_interval(secs => %s) WHERE id = %s",
        (heartbeat_s, streak_s, executor_id),
    )


def peer(conn: Conn, executor_id: str, *, runs: int = 0, lock_key: int = 7) -> None:
    """A peer's row (as if registered from another host) and `runs` PENDING workflows."""
    conn.execute(
        "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, lock_key) "
        "VALUES (%s, 'v1', 'elsewhere', 1, %s)",
        (executor_id, lock_key),
    )
    conn.execute(
        "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, executor_id,"
        " owner_xid) SELECT %s || '-' || i, 'PENDING', 'ledgerloop_run', 'ledgerloop_runs', %s,"
        " 'token' FROM generate_series(1, %s) i",
        (executor_id, executor_id, runs),
    )


def statuses(conn: Conn, executor_id: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status, count(*) AS n FROM dbos.workflow_status "
        "WHERE workflow_uuid LIKE %s || '-%%' GROUP BY status",
        (executor_id,),
    ).fetchall()
    return {r["status"]: r["n"] for r in rows}


def rows(conn: Conn) -> set[str]:
    return {r["id"] for r in conn.execute("SELECT id FROM ledgerloop.executor").fetchall()}


def test_a_dead_worker_and_all_its_runs_are_taken_over_in_one_statement(
    conn: Conn, me: Heartbeat
) -> None:
    peer(conn, "dead", runs=300)
    age(conn, "dead", heartbeat_s=6)
    age(conn, "me", heartbeat_s=0)
    takeovers = me.tick()
    assert takeovers == [Takeover("dead", "elsewhere", pytest.approx(6, abs=1), 300)]
    assert statuses(conn, "dead") == {"ENQUEUED": 300}
    assert rows(conn) == {"me"}
    # Back on their own queue, unowned, so any worker's dispatcher claims them afresh.
    assert conn.execute(
        "SELECT count(*) AS n FROM dbos.workflow_status WHERE workflow_uuid LIKE 'dead-%%' "
        "AND queue_name = 'ledgerloop_runs' AND owner_xid IS NULL"
    ).fetchone() == {"n": 300}


def test_runs_taken_over_from_a_worker_of_an_earlier_timeline_are_marked_rewound(
    conn: Conn, me: Heartbeat
) -> None:
    # A worker that died with a primary that failed over never ran the rewind check; the one
    # that takes it over (here `me`, started after the failover, with nothing in memory)
    # knows only that the dead worker's row names another timeline than the server's now.
    assert me.timeline is not None
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for executor_id, timeline in (("old-timeline", me.timeline - 1), ("same-timeline", None)):
        peer(conn, executor_id)
        conn.execute(
            "UPDATE ledgerloop.executor SET timeline = coalesce(%s, %s) WHERE id = %s",
            (timeline, me.timeline, executor_id),
        )
        age(conn, executor_id, heartbeat_s=6)
    # Runs under their own ids (run_rewound names runs): two of the old worker, one of the
    # other.
    for run_id, executor_id in zip(
        ids, ("old-timeline", "old-timeline", "same-timeline"), strict=True
    ):
        conn.execute(
            "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name,"
            " executor_id, owner_xid) VALUES (%s, 'PENDING', 'ledgerloop_run', "
            "'ledgerloop_runs', %s, 'token')",
            (run_id, executor_id),
        )
    age(conn, "me", heartbeat_s=0)
    taken = {t.executor_id: t.runs for t in me.tick()}
    assert taken == {"old-timeline": 2, "same-timeline": 1}
    marked = {
        str(r["run_id"])
        for r in conn.execute("SELECT run_id FROM ledgerloop.run_rewound").fetchall()
    }
    assert marked == set(ids[:2])


def test_a_worker_that_is_merely_quiet_is_left_alone(conn: Conn, me: Heartbeat) -> None:
    # Silent for longer than its lease, but its heartbeat session is alive (the lock held
    # elsewhere): only stale_after_s of silence would make it dead.
    peer(conn, "quiet", runs=3, lock_key=11)
    age(conn, "quiet", heartbeat_s=3)
    age(conn, "me", heartbeat_s=0)
    with connect(me.url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, 11)", (LOCK_NAMESPACE,))
        assert me.tick() == []
    assert statuses(conn, "quiet") == {"PENDING": 3}


def test_a_killed_worker_is_taken_over_once_its_lease_is_out_and_its_session_gone(
    conn: Conn, me: Heartbeat
) -> None:
    peer(conn, "killed", runs=2, lock_key=12)
    age(conn, "me", heartbeat_s=0)
    # Within its lease: never, whatever its session looks like.
    age(conn, "killed", heartbeat_s=TIMINGS.lease_s - 0.5)
    assert me.tick() == []
    # Past its lease, with nobody holding its lock: the process is gone.
    age(conn, "killed", heartbeat_s=TIMINGS.session_dead_s + 0.2)
    assert [t.executor_id for t in me.tick()] == ["killed"]
    assert statuses(conn, "killed") == {"ENQUEUED": 2}


def test_a_free_lock_proves_nothing_after_the_database_restarted(conn: Conn, me: Heartbeat) -> None:
    # Our session began after the peer's last heartbeat: the server may have restarted in
    # between (every session and lock gone), so the peer is given stale_after_s.
    peer(conn, "restarted", runs=2, lock_key=15)
    age(conn, "me", heartbeat_s=0)
    age(conn, "restarted", heartbeat_s=TIMINGS.session_dead_s + 0.5)
    session_began(me, TIMINGS.session_dead_s)  # a session newer than the peer's heartbeat
    assert me.tick() == []
    assert statuses(conn, "restarted") == {"PENDING": 2}
    # The same silence with our session older than it: its session is gone, it is dead.
    session_began(me, 60)
    assert [t.executor_id for t in me.tick()] == ["restarted"]


def test_a_killed_worker_is_taken_over_as_its_lease_runs_out_not_at_the_next_heartbeat(
    conn: Conn, db_url: str
) -> None:
    # Heartbeats 4 s apart, a lease of 10 s: the peer's lease runs out 0.6 s after our first
    # tick, and its session is gone. Our thread ticks again at that moment (the regular
    # tick would come 4 s after the first one).
    timings = FleetTimings(heartbeat_s=4.0, stale_after_s=16.0)
    me = Heartbeat(db_url, "me", "v1", timings, Fence(timings.lease_s))
    me.register()
    session_began(me, 60)
    peer(conn, "killed", runs=2, lock_key=13)
    peer(conn, "alive", runs=1, lock_key=14)
    age(conn, "me", heartbeat_s=0)
    age(conn, "killed", heartbeat_s=timings.session_dead_s - 0.6)
    age(conn, "alive", heartbeat_s=timings.session_dead_s - 0.3)
    taken: list[tuple[str, float]] = []
    me.on_takeover = lambda t: taken.append((t.executor_id, time.monotonic()))
    with connect(db_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, 14)", (LOCK_NAMESPACE,))
        started = time.monotonic()
        me.start()
        try:
            wait_until(lambda: taken, timeout=10, interval=0.02)
        finally:
            me.stop()
    [(executor_id, at)] = taken
    assert executor_id == "killed"
    assert 0.5 <= at - started < 3  # after its lease, before our next regular heartbeat
    assert statuses(conn, "killed") == {"ENQUEUED": 2}
    assert statuses(conn, "alive") == {"PENDING": 1}  # its session is held: left alone


def test_a_worker_without_an_unbroken_streak_judges_nobody(conn: Conn, me: Heartbeat) -> None:
    # After an outage every heartbeat is old, ours included: our next heartbeat starts a new
    # streak, and we judge nobody until it is stale_after_s long.
    peer(conn, "other", runs=1)
    age(conn, "other", heartbeat_s=11, streak_s=100)
    age(conn, "me", heartbeat_s=11, streak_s=100)
    assert me.tick() == []
    assert statuses(conn, "other") == {"PENDING": 1}
    streak = conn.execute(
        "SELECT now() - streak_started_at < interval '1 second' AS fresh "
        "FROM ledgerloop.executor WHERE id = 'me'"
    ).fetchone()
    assert streak == {"fresh": True}
    # The peer comes back meanwhile: it is never declared dead.
    conn.execute("UPDATE ledgerloop.executor SET heartbeat_at = now() WHERE id = 'other'")
    age(conn, "me", heartbeat_s=0, streak_s=6)
    assert me.tick() == []
    assert rows(conn) == {"me", "other"}


def test_two_judges_take_a_dead_worker_over_exactly_once(db_url: str, conn: Conn) -> None:
    judges = [make_heartbeat(db_url, f"judge-{i}") for i in range(2)]
    for judge in judges:
        judge.register()
        age(conn, judge.executor_id, heartbeat_s=0)
    peer(conn, "dead", runs=50)
    age(conn, "dead", heartbeat_s=30)
    try:
        taken = [t for judge in judges for t in judge.tick()]
    finally:
        for judge in judges:
            judge.stop()
    assert [(t.executor_id, t.runs) for t in taken] == [("dead", 50)]


def test_a_worker_taken_over_while_frozen_revokes_its_fence_and_registers_again(
    conn: Conn, me: Heartbeat
) -> None:
    fence = me.fence
    generation = fence.generation
    conn.execute("DELETE FROM ledgerloop.executor WHERE id = 'me'")  # a peer took us over
    me.tick()
    assert fence.generation == generation + 1
    assert not fence.trusted("an execution from before")  # must ask the database first
    assert fence.valid()  # registered again: new executions may run
    assert rows(conn) == {"me"}


def test_registering_again_touches_the_runs_it_still_holds(conn: Conn, me: Heartbeat) -> None:
    # An orphan sweep that read "no row" for these runs re-reads them after our
    # registration commits, and then finds them fresh.
    conn.execute(
        "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, executor_id, updated_at) "
        "VALUES ('me-1', 'PENDING', 'ledgerloop_run', 'me', 0)"
    )
    me.register()
    touched = conn.execute(
        "SELECT updated_at > 0 AS fresh FROM dbos.workflow_status WHERE workflow_uuid = 'me-1'"
    ).fetchone()
    assert touched == {"fresh": True}


def test_runs_of_a_worker_with_no_row_are_swept_back_once_old(conn: Conn, me: Heartbeat) -> None:
    conn.execute(
        "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, executor_id,"
        " updated_at) VALUES ('gone-1', 'PENDING', 'ledgerloop_run', 'ledgerloop_runs', 'gone',"
        " 0), ('gone-2', 'PENDING', 'ledgerloop_run', 'ledgerloop_runs', 'gone',"
        " (extract(epoch FROM now()) * 1000)::bigint)"
    )
    age(conn, "me", heartbeat_s=0)
    me._ticks = int(30 / TIMINGS.heartbeat_s) - 1  # the next tick sweeps
    me.tick()
    assert statuses(conn, "gone") == {"ENQUEUED": 1, "PENDING": 1}


def test_a_heartbeat_that_cannot_reach_the_database_lets_the_lease_run_out(
    db_url: str, conn: Conn
) -> None:
    clock = [100.0]
    fence = Fence(TIMINGS.lease_s, clock=lambda: clock[0])
    heartbeat = Heartbeat(db_url, "cut-off", "v1", TIMINGS, fence, clock=lambda: clock[0])
    heartbeat.register()
    assert fence.valid()
    heartbeat.url = "postgresql://postgres@127.0.0.1:1/nowhere"  # the database is gone
    heartbeat._drop_connection()
    clock[0] += TIMINGS.lease_s + 0.01
    assert heartbeat.tick() == []
    assert not fence.valid()
    heartbeat.stop()


def test_the_lease_runs_out_before_any_peer_may_take_a_worker_over() -> None:
    for heartbeat_s, stale in [(0.5, 5.0), (1.0, 4.0), (0.1, 0.4), (2.0, 60.0)]:
        timings = FleetTimings(heartbeat_s, stale)
        assert heartbeat_s < timings.lease_s < timings.session_dead_s <= stale
        # Busy: two heartbeats may be late before the fence closes.
        assert 2 * timings.busy_heartbeat_s < timings.busy_lease_s < timings.lease_s


def lease_left(conn: Conn, executor_id: str) -> float:
    """Seconds until the lease recorded in `executor_id`'s row runs out (database clock)."""
    row = conn.execute(
        "SELECT extract(epoch FROM lease_until - now())::float8 AS s"
        " FROM ledgerloop.executor WHERE id = %s",
        (executor_id,),
    ).fetchone()
    assert row is not None
    return float(row["s"])


def test_a_busy_worker_heartbeats_more_often_and_records_a_shorter_lease(
    db_url: str, conn: Conn
) -> None:
    clock = [100.0]
    fence = Fence(TIMINGS.lease_s, clock=lambda: clock[0])
    me = Heartbeat(db_url, "me", "v1", TIMINGS, fence, clock=lambda: clock[0])
    me.register()
    assert me.interval_s() == TIMINGS.heartbeat_s
    assert lease_left(conn, "me") == pytest.approx(TIMINGS.lease_s, abs=0.3)
    loop = asyncio.new_event_loop()
    execution = loop.create_task(asyncio.sleep(0))
    fence.executions.add(execution)
    try:
        assert me.busy()
        assert me.interval_s() == TIMINGS.busy_heartbeat_s
        # The idle lease just granted is not taken back: the row keeps its later end.
        me.tick()
        assert lease_left(conn, "me") == pytest.approx(TIMINGS.lease_s, abs=0.3)
        assert fence.remaining_s() == pytest.approx(TIMINGS.lease_s)
        # Once it has run out (on both clocks), a busy heartbeat grants the shorter lease,
        # and the row records it.
        clock[0] += TIMINGS.lease_s
        conn.execute("UPDATE ledgerloop.executor SET lease_until = now() WHERE id = 'me'")
        me.tick()
        assert fence.remaining_s() == pytest.approx(TIMINGS.busy_lease_s)
        assert lease_left(conn, "me") == pytest.approx(TIMINGS.busy_lease_s, abs=0.3)
    finally:
        fence.executions.discard(execution)
        loop.run_until_complete(execution)
        loop.close()
        me.stop()


def test_a_killed_busy_worker_is_taken_over_once_its_recorded_lease_is_out(
    conn: Conn, me: Heartbeat
) -> None:
    # Both heard from 0.9 s ago, less than an idle lease: only the rows' leases tell them
    # apart. Neither session is alive.
    peer(conn, "busy", runs=2, lock_key=16)
    peer(conn, "closer", runs=1, lock_key=17)
    age(conn, "me", heartbeat_s=0)
    for executor_id in ("busy", "closer"):
        age(conn, executor_id, heartbeat_s=0.9)
    conn.execute(
        "UPDATE ledgerloop.executor SET lease_until = now() - make_interval(secs => %s)"
        " WHERE id = 'busy'",
        (SESSION_MARGIN_S + 0.05,),
    )
    # Its lease ran out, but not yet by the margin.
    conn.execute(
        "UPDATE ledgerloop.executor SET lease_until = now() - make_interval(secs => %s)"
        " WHERE id = 'closer'",
        (SESSION_MARGIN_S - 0.3,),
    )
    assert [t.executor_id for t in me.tick()] == ["busy"]
    assert statuses(conn, "busy") == {"ENQUEUED": 2}
    assert statuses(conn, "closer") == {"PENDING": 1}
    # It is due as soon as the margin has passed, and the worker ticks again then.
    assert me._due_s is not None
    assert me._due_s < 0.5


def test_unregister_hands_the_runs_back_and_removes_the_row(db_url: str, conn: Conn) -> None:
    heartbeat = make_heartbeat(db_url, f"leaving-{uuid.uuid4().hex[:6]}")
    heartbeat.register()
    run_id = str(uuid.uuid4())  # a run's workflow id is the run's uuid
    conn.execute(
        "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, executor_id)"
        " VALUES (%s, 'PENDING', 'ledgerloop_run', 'ledgerloop_runs', %s)",
        (run_id, heartbeat.executor_id),
    )
    assert heartbeat.unregister() == 1
    row = conn.execute(
        "SELECT status, owner_xid FROM dbos.workflow_status WHERE workflow_uuid = %s", (run_id,)
    ).fetchone()
    assert row == {"status": "ENQUEUED", "owner_xid": None}
    assert heartbeat.executor_id not in rows(conn)


def test_enqueued_runs_notify_the_dispatchers(db_url: str, conn: Conn) -> None:
    with psycopg.connect(listen_url(db_url), autocommit=True) as listener:
        listener.execute("LISTEN ledgerloop_runs")
        conn.execute(
            "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name) "
            "SELECT 'burst-' || i, 'ENQUEUED', 'ledgerloop_run', 'ledgerloop_runs' "
            "FROM generate_series(1, 50) i"
        )
        # Another queue's rows, and rows that leave ENQUEUED, wake nobody.
        conn.execute(
            "INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name) "
            "VALUES ('other-1', 'ENQUEUED', 'x', 'other_queue')"
        )
        conn.execute("UPDATE dbos.workflow_status SET status = 'PENDING' WHERE name = 'x'")
        conn.execute("NOTIFY ledgerloop_runs, 'end'")  # notifications arrive in commit order
        woken = []
        for note in listener.notifies(timeout=10):
            woken.append(note.payload)
            if note.payload == "end":
                break
    # One notification for the burst (one transaction), none for the others.
    assert woken == ["", "end"]


def test_a_row_locked_by_a_frozen_worker_does_not_stall_the_heartbeat(
    conn: Conn, me: Heartbeat
) -> None:
    # The dead worker froze in the middle of a checkpoint: its transaction holds a lock on
    # one of its workflow rows. The takeover skips that row instead of waiting for it.
    peer(conn, "frozen", runs=3)
    age(conn, "frozen", heartbeat_s=10)
    age(conn, "me", heartbeat_s=0)
    with connect(me.url) as frozen:
        frozen.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = 'frozen-1' FOR NO KEY UPDATE"
        )
        takeovers = me.tick()
        frozen.rollback()
    assert [(t.executor_id, t.runs) for t in takeovers] == [("frozen", 2)]
    assert statuses(conn, "frozen") == {"ENQUEUED": 2, "PENDING": 1}
    assert me.fence.valid()  # the heartbeat itself landed
