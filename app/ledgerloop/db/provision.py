"""Which database this process uses: the configured one, or the embedded one."""

from __future__ import annotations

from collections.abc import Callable

from ledgerloop.config import Settings
from ledgerloop.db.url import validate_url


def resolve_database_url(
    settings: Settings, announce: Callable[[str], None] = print, *, keep_running: bool = True
) -> str:
    """LEDGERLOOP_DATABASE_URL when set (nothing is started); else the embedded Postgres.

    keep_running=False: an embedded server started here stops when this process exits (the
    CLI's one-shot commands); one already running is left as it is.
    """
    if settings.database_url:
        return validate_url(settings.database_url)
    from ledgerloop.db.embedded import start_embedded

    url = start_embedded(settings.pgdata, keep_running=keep_running)
    announce(f"embedded Postgres: {url}")
    return url
