"""Validating and converting database URLs."""

from __future__ import annotations

import psycopg

from ledgerloop.db.errors import DatabaseUrlInvalid

_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")


def validate_url(url: str) -> str:
    """Return `url` in the plain postgresql:// form, or raise DatabaseUrlInvalid."""
    fix = "use the form postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME"
    if not url.startswith(_SCHEMES):
        scheme = url.split("://", 1)[0] if "://" in url else url[:20]
        raise DatabaseUrlInvalid(
            f"LEDGERLOOP_DATABASE_URL must be a postgresql:// URL, not {scheme!r}", fix=fix
        )
    plain = "postgresql://" + url.split("://", 1)[1]
    try:
        info = psycopg.conninfo.conninfo_to_dict(plain)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUrlInvalid(
            f"LEDGERLOOP_DATABASE_URL cannot be parsed: {str(exc).splitlines()[0]}", fix=fix
        ) from exc
    port = info.get("port")
    if port is not None and not str(port).isdigit():
        raise DatabaseUrlInvalid(f"LEDGERLOOP_DATABASE_URL has a bad port {port!r}", fix=fix)
    return plain


def sqlalchemy_url(url: str) -> str:
    """The same URL with the psycopg 3 driver named, as SQLAlchemy and alembic want it."""
    return "postgresql+psycopg://" + validate_url(url).split("://", 1)[1]


def with_database(url: str, dbname: str) -> str:
    """`url` pointing at another database on the same server (query and credentials kept)."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(validate_url(url))
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
