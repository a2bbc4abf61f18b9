"""Validating and converting database URLs.

libpq takes several hosts in two spellings: in the authority
(`postgresql://u@h1:5432,h2:5433/db`) and as query parameters
(`postgresql://u@/db?host=h1,h2&port=5432,5433`). psycopg takes both; SQLAlchemy (and so
DBOS and alembic) parses only the second, reading the first's ports as one bad integer.
`validate_url` rewrites the first into the second, so every consumer gets a URL it reads
the same way; libpq then tries the hosts in order (`target_session_attrs` and the rest of
the query are kept as given).
"""

from __future__ import annotations

import re

import psycopg

from ledgerloop.db.errors import DatabaseUrlInvalid

_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
_FIX = (
    "use the form postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME (several hosts: "
    "HOST1:PORT1,HOST2:PORT2 or ?host=HOST1,HOST2&port=PORT1,PORT2)"
)
#: One entry of a comma-separated authority: a bracketed IPv6 address or a name, then a port.
_HOST_ENTRY = re.compile(r"^(\[[^\]]*\]|[^:\[\]]*)(?::(.*))?$")


def validate_url(url: str) -> str:
    """Return `url` in the plain postgresql:// form, several hosts as query parameters, or
    raise DatabaseUrlInvalid naming what is wrong (never the password)."""
    if not url.startswith(_SCHEMES):
        scheme = url.split("://", 1)[0] if "://" in url else url[:20]
        raise DatabaseUrlInvalid(
            f"LEDGERLOOP_DATABASE_URL must be a postgresql:// URL, not {scheme!r}", fix=_FIX
        )
    plain = "postgresql://" + _hosts_as_query(url.split("://", 1)[1])
    try:
        info = psycopg.conninfo.conninfo_to_dict(plain)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUrlInvalid(
            f"LEDGERLOOP_DATABASE_URL cannot be parsed: {str(exc).splitlines()[0]}", fix=_FIX
        ) from exc
    hosts = [h for h in str(info.get("host") or info.get("hostaddr") or "").split(",") if h]
    # Without a host or a database libpq would fill in its defaults (a local socket, a
    # database named after the OS user): a URL such as `postgres://` is a mistake, not that.
    if not hosts:
        raise DatabaseUrlInvalid(
            "LEDGERLOOP_DATABASE_URL names no host",
            fix=_FIX + "; for a Unix socket, ?host=/path/to/socket/directory",
        )
    if not info.get("dbname"):
        raise DatabaseUrlInvalid("LEDGERLOOP_DATABASE_URL names no database", fix=_FIX)
    port = info.get("port")
    if port is not None:
        ports = str(port).split(",")
        bad = [p for p in ports if p and not p.isdigit()]
        if bad or not any(ports):
            raise DatabaseUrlInvalid(
                f"LEDGERLOOP_DATABASE_URL has a bad port {(bad or [str(port)])[0]!r}", fix=_FIX
            )
        if len(ports) > 1 and len(ports) != len(hosts):
            raise DatabaseUrlInvalid(
                f"LEDGERLOOP_DATABASE_URL names {len(hosts)} hosts but {len(ports)} ports",
                fix="give one port per host, or a single port for all of them",
            )
    return plain


def _hosts_as_query(rest: str) -> str:
    """`rest` (the URL after its scheme) with a comma-separated authority moved into the
    query as host=...&port=...; any other URL unchanged."""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    if "," not in hostport:
        return rest
    hosts: list[str] = []
    ports: list[str] = []
    for entry in hostport.split(","):
        match = _HOST_ENTRY.match(entry)
        if match is None or not match.group(1):
            raise DatabaseUrlInvalid(
                f"LEDGERLOOP_DATABASE_URL has a bad host entry {entry!r}", fix=_FIX
            )
        hosts.append(match.group(1).strip("[]"))
        ports.append(match.group(2) or "")
    path, _, fragment = tail.partition("#")
    path, _, query = path.partition("?")
    if re.search(r"(^|&)(host|hostaddr|port)=", query):
        raise DatabaseUrlInvalid(
            "LEDGERLOOP_DATABASE_URL names hosts both before the path and in ?host=",
            fix="name them in one place",
        )
    # An empty port is libpq's default for that host (SQLAlchemy reads it the same way).
    params = [f"host={','.join(hosts)}"]
    if any(ports):
        params.append(f"port={','.join(ports)}")
    if query:
        params.append(query)
    return f"{userinfo}{at}{path or '/'}?{'&'.join(params)}" + (f"#{fragment}" if fragment else "")


def sqlalchemy_url(url: str) -> str:
    """The same URL with the psycopg 3 driver named, as SQLAlchemy and alembic want it."""
    return "postgresql+psycopg://" + validate_url(url).split("://", 1)[1]


def with_database(url: str, dbname: str) -> str:
    """`url` pointing at another database on the same server (query and credentials kept)."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(validate_url(url))
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
