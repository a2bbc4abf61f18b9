"""Connection pooler routes: which URL goes through a transaction-mode pooler (PgBouncer), and
the direct URL that carries what such a pooler cannot.

A transaction-mode pooler hands each transaction whichever server connection is free. So on
a pooled URL Ledgerloop never relies on anything that outlives a transaction:

- no server-side prepared statements (psycopg's `prepare_threshold=None`): a statement
  prepared on one server connection is unknown on the next, or collides with a name another
  client prepared there (`DuplicatePreparedStatement`);
- no session settings (`SET`): the next client of that server connection would inherit
  them; settings are `SET LOCAL` / `set_config(..., true)` inside a transaction instead;
- no session advisory locks and no LISTEN: they stay on a server connection the client no
  longer has. They go to the direct URL (`LEDGERLOOP_DIRECT_DATABASE_URL`) when there is one;
  without it, LISTEN is replaced by polling and the locks by what docs/operations.md says.

Direct connections keep prepared statements: they save a parse and plan per statement.

The routes are registered by `Settings` (config.py) when they are read, so every connection
made from that URL in this process (`connect`, `make_pool`, the relay's, DBOS's engine) gets
the right options without each caller passing them on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ledgerloop.errors import ConfigError

#: psycopg's option that turns server-side prepared statements off.
NO_PREPARE: dict[str, Any] = {"prepare_threshold": None}


class PoolerNeedsDirectUrl(ConfigError):
    """Something that needs a session of its own was asked of a transaction-mode pooler."""


@dataclass(frozen=True)
class Route:
    #: The URL runs through a transaction-mode pooler.
    pooled: bool
    #: Where session work goes (LISTEN, session advisory locks, migrations); None: nowhere.
    direct_url: str | None


_lock = threading.Lock()
_routes: dict[str, Route] = {}


def _key(url: str) -> str:
    # The scheme spellings db/url.py accepts name one URL (this module sits below db/url.py,
    # beside config.py, which registers the routes).
    return "postgresql://" + url.split("://", 1)[1] if "://" in url else url


def register(url: str, *, pooled: bool, direct_url: str | None) -> None:
    """Record how `url` is reached (called by Settings; the latest registration wins)."""
    with _lock:
        _routes[_key(url)] = Route(pooled, _key(direct_url) if direct_url else None)


def route(url: str) -> Route:
    with _lock:
        return _routes.get(_key(url), Route(False, None))


def is_pooled(url: str) -> bool:
    return route(url).pooled


def session_url(url: str) -> str | None:
    """The URL for session work on `url`'s database: `url` itself when it is direct, its
    direct URL when it is pooled, None when a pooled URL has no direct one."""
    found = route(url)
    if not found.pooled:
        return url
    return found.direct_url


def connect_kwargs(url: str) -> dict[str, Any]:
    """psycopg connection options for `url` (no prepared statements through a pooler)."""
    return dict(NO_PREPARE) if is_pooled(url) else {}


def engine_connect_args(url: str, application_name: str | None = None) -> dict[str, Any]:
    """SQLAlchemy `connect_args` for `url` (psycopg 3 driver)."""
    args: dict[str, Any] = connect_kwargs(url)
    if application_name:
        args["application_name"] = application_name
    return args
