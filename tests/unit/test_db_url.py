"""LEDGERLOOP_DATABASE_URL: what is refused (one line naming the problem), and how several
hosts are rewritten so that psycopg, SQLAlchemy and DBOS all read them alike."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from ledgerloop.db.errors import DatabaseUrlInvalid, describe_target
from ledgerloop.db.url import sqlalchemy_url, validate_url, with_database


def _connect_args(url: str) -> dict[str, object]:
    """What SQLAlchemy's psycopg dialect would hand to psycopg.connect for `url`."""
    parsed = sa.make_url(sqlalchemy_url(url))
    engine = sa.create_engine(parsed)
    try:
        _, kwargs = engine.dialect.create_connect_args(parsed)
    finally:
        engine.dispose()
    kwargs.pop("context", None)
    return kwargs


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgres://", "names no host"),
        ("postgresql://", "names no host"),
        ("postgresql:///app", "names no host"),
        ("postgresql://u@db.internal", "names no database"),
        ("postgresql://u@db.internal/", "names no database"),
        ("postgresql://u@db:54x2/app", "bad port '54x2'"),
        ("postgresql://u@h1:5432,h2:five/app", "bad port 'five'"),
        ("postgresql://u@/app?host=h1,h2&port=1,2,3", "names 2 hosts but 3 ports"),
        ("postgresql://u@h1,h2/app?host=h3", "both before the path and in ?host="),
        ("mysql://u@h/app", "must be a postgresql:// URL, not 'mysql'"),
    ],
)
def test_a_bad_url_is_refused_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(DatabaseUrlInvalid) as caught:
        validate_url(url)
    line = caught.value.one_line()
    assert problem in line, line
    assert "\n" not in line


def test_the_password_never_appears_in_a_refusal() -> None:
    with pytest.raises(DatabaseUrlInvalid) as caught:
        validate_url("postgresql://u:s3cr3t-pw@h1:5432,h2:nope/app")
    assert "s3cr3t-pw" not in caught.value.one_line()


def test_one_host_is_left_as_given() -> None:
    url = "postgresql://u:pw@db.internal:6432/app?sslmode=require"
    assert validate_url(url) == url
    assert validate_url("postgres://u@db/app") == "postgresql://u@db/app"
    socket = "postgresql://u@/app?host=/var/run/postgresql"
    assert validate_url(socket) == socket


def test_hosts_in_the_authority_move_into_the_query() -> None:
    url = "postgresql://u:p%40ss@h1:5432,h2:5433/app?target_session_attrs=read-write"
    plain = validate_url(url)
    assert plain == (
        "postgresql://u:p%40ss@/app?host=h1,h2&port=5432,5433&target_session_attrs=read-write"
    )
    # psycopg reads the rewritten URL as it read the original...
    assert psycopg.conninfo.conninfo_to_dict(plain) == psycopg.conninfo.conninfo_to_dict(url)
    # ...and SQLAlchemy (DBOS, alembic) now reads it at all, the same way.
    assert _connect_args(url) == {
        "dbname": "app",
        "user": "u",
        "password": "p@ss",
        "host": "h1,h2",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
    }


def test_the_query_form_is_accepted_as_it_is() -> None:
    url = "postgresql://u@/app?host=h1,h2&port=5432,5433&target_session_attrs=read-write"
    assert validate_url(url) == url
    assert _connect_args(url)["host"] == "h1,h2"
    assert _connect_args(url)["target_session_attrs"] == "read-write"


def test_hosts_without_ports_ipv6_and_a_missing_port_among_several() -> None:
    assert validate_url("postgresql://u@h1,h2/app") == "postgresql://u@/app?host=h1,h2"
    plain = validate_url("postgresql://u@[::1]:5433,h2/app")
    assert plain == "postgresql://u@/app?host=::1,h2&port=5433,"
    info = psycopg.conninfo.conninfo_to_dict(plain)
    assert (info["host"], info["port"]) == ("::1,h2", "5433,")
    assert _connect_args(plain)["port"] == "5433,"  # libpq: the default port for h2


def test_with_database_and_describe_target_keep_every_host() -> None:
    url = "postgresql://u:pw@h1:5432,h2:5433/app?target_session_attrs=read-write"
    other = with_database(url, "other")
    assert other == (
        "postgresql://u:pw@/other?host=h1,h2&port=5432,5433&target_session_attrs=read-write"
    )
    assert describe_target(validate_url(url)) == "h1:5432,h2:5433/app"
    assert "pw" not in describe_target(validate_url(url))
