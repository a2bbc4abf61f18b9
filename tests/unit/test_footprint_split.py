"""LEDGERLOOP_MAX_CONNECTIONS split between a process's parts, and its refusals."""

from __future__ import annotations

import pytest

from ledgerloop.config import load_settings
from ledgerloop.db import footprint
from ledgerloop.db.capacity import Capacity, room_problem
from ledgerloop.errors import ConfigError


def test_the_default_split_of_ledgerloop_up() -> None:
    shape = load_settings().footprint("up", relay=True)
    assert shape.cap == 15
    assert shape.fixed == (
        "heartbeat",
        "listener",
        "relay claim",
        "relay record",
        "reconciler",
        "spare",
    )
    assert shape.pools == {"dbos": 3, "pool": 4, "relay steps": 2}
    assert shape.total == 15


@pytest.mark.parametrize(
    ("process", "relay"), [("up", True), ("up", False), ("relay", True), ("http", True)]
)
@pytest.mark.parametrize("cap", [11, 15, 16, 23, 40, 100])
def test_every_split_stays_under_the_cap_and_above_the_minimum(
    process: footprint.Process, relay: bool, cap: int
) -> None:
    least = footprint.minimum(process, relay=relay)
    shape = footprint.plan(cap, process, relay=relay)
    assert shape.total <= cap
    assert shape.total >= least
    for name, size in shape.pools.items():
        assert size >= (2 if name in ("dbos", "pool") else 1), (name, size)


def test_minimums() -> None:
    assert footprint.minimum("up", relay=True) == 11
    assert footprint.minimum("up", relay=False) == 7
    assert footprint.minimum("relay") == 5


def test_a_cap_below_the_minimum_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(max_connections=8).footprint("up", relay=True)
    line = caught.value.one_line()
    assert "\n" not in line
    assert "LEDGERLOOP_MAX_CONNECTIONS is 8, below the 11" in line
    assert "set LEDGERLOOP_MAX_CONNECTIONS to 11 or more" in line
    # Without the relay the same cap fits.
    assert load_settings(max_connections=8).footprint("up", relay=False).total == 8


def test_explicit_pool_sizes_must_fit_under_the_cap() -> None:
    shape = load_settings(dbos_pool_size=4, pool_size=5, max_connections=20).footprint()
    assert shape.pools["dbos"] == 4
    assert shape.pools["pool"] == 5
    assert shape.total <= 20
    with pytest.raises(ConfigError) as caught:
        load_settings(pool_size=12).footprint()
    line = caught.value.one_line()
    assert "LEDGERLOOP_POOL_SIZE=12 do not fit under LEDGERLOOP_MAX_CONNECTIONS=15" in line
    assert "raise LEDGERLOOP_MAX_CONNECTIONS to 21" in line


def test_application_names_carry_the_executor_and_fit_postgres() -> None:
    footprint.name_executor("a-very-long-host-name-that-goes-on-and-on-" + "f" * 16)
    try:
        name = footprint.application_name("ledgerloop-relay-steps")
        assert name.startswith("ledgerloop:")
        assert name.endswith(":relay-steps")
        assert "f" * 16 in name
        assert len(name) <= 63
    finally:
        footprint.name_executor(None)
    assert footprint.application_name("ledgerloop-worker") == "ledgerloop-worker"


def _capacity(**changes: object) -> Capacity:
    base: dict[str, object] = {
        "max_connections": 100,
        "reserved": 3,
        "superuser": False,
        "role": "app",
        "role_limit": -1,
        "database": "shop",
        "database_limit": -1,
        "in_use": 10,
        "ledgerloop": 0,
        "role_in_use": 2,
        "database_in_use": 5,
    }
    return Capacity(**{**base, **changes})  # type: ignore[arg-type]


def test_room_problems_name_the_limit() -> None:
    assert room_problem(_capacity(), 15) is None
    server = room_problem(_capacity(in_use=90), 15)
    assert server is not None
    assert "max_connections 100, 90 in use" in server[0]
    assert server[1] == 7
    role = room_problem(_capacity(role_limit=10), 15)
    assert role is not None
    assert "role app has CONNECTION LIMIT 10" in role[0]
    assert "ALTER ROLE app CONNECTION LIMIT 17" in role[2]
    database = room_problem(_capacity(database_limit=12), 15)
    assert database is not None
    assert "database shop has CONNECTION LIMIT 12" in database[0]
    # A superuser is bound by neither limit, and may use the reserved slots.
    assert room_problem(_capacity(superuser=True, role_limit=1, in_use=85), 15) is None


def test_a_standalone_api_keeps_its_client_and_listener_under_the_cap() -> None:
    shape = load_settings().footprint("http")
    assert shape.fixed == ("listener", "spare")
    assert shape.pools == {"dbos": 2, "http": 11}
    assert shape.total == 15
