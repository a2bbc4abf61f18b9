"""A PgBouncer in transaction mode in front of a test server (Debian's `pgbouncer` package,
installed by scripts/install-pgbouncer).

It runs with its own configuration in a temporary directory, on a free port of 127.0.0.1,
as the cluster's system user when started as root (PgBouncer refuses to run as root). Every
database of the server is reachable through it by name (a `*` entry), so each test's own
database is too. Authentication is `trust` with a userlist naming the server's user, as the
test server itself trusts local connections.

PgBouncer 1.18 (Debian bookworm) does not support protocol-level prepared statements in
transaction mode, and it resets nothing between clients of a server connection: a session
setting, a session advisory lock or a LISTEN made by one client stays with the server
connection for the next. That is exactly what Ledgerloop must survive.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from ledgerloop.db.cluster import free_port

#: Environment switch for the suite: route each test's database URL through PgBouncer.
ENV_POOLER = "LEDGERLOOP_TEST_POOLER"


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


@dataclass
class PgBouncer:
    """A running PgBouncer; `pooled(url)` is `url` through it."""

    host: str
    port: int
    root: Path
    process: subprocess.Popen[bytes]
    #: Server connections per database and user.
    pool_size: int = 10

    def pooled(self, url: str) -> str:
        parts = urlsplit(url)
        user = parts.username or "postgres"
        auth = f"{user}:{parts.password}@" if parts.password else f"{user}@"
        return urlunsplit(parts._replace(netloc=f"{auth}{self.host}:{self.port}"))

    def admin_url(self, user: str = "postgres") -> str:
        """PgBouncer's admin console (SHOW POOLS, SHOW SERVERS...)."""
        return f"postgresql://{user}@{self.host}:{self.port}/pgbouncer"

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text()[-4000:] if path.exists() else ""


def _server_address(admin_url: str) -> tuple[str, int, str, str]:
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    return (
        str(info.get("host") or "127.0.0.1"),
        int(info.get("port") or 5432),
        str(info.get("user") or "postgres"),
        str(info.get("password") or ""),
    )


@contextmanager
def pgbouncer(admin_url: str, *, pool_size: int = 10, timeout: float = 10.0) -> Iterator[PgBouncer]:
    """Start PgBouncer (transaction mode) in front of the server of `admin_url`."""
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (scripts/install-pgbouncer)")
    host, port, user, password = _server_address(admin_url)
    listen = free_port()
    with tempfile.TemporaryDirectory(prefix="ledgerloop-pgbouncer-") as tmp:
        root = Path(tmp)
        run_as = None
        if os.geteuid() == 0:
            for name in ("postgres", "ledgerloop"):
                try:
                    run_as = pwd.getpwnam(name)
                    break
                except KeyError:
                    continue
        server_password = f" password={password}" if password else ""
        (root / "userlist.txt").write_text(f'"{user}" "{password}"\n')
        (root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}{server_password}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {listen}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {root / 'userlist.txt'}\n"
            f"admin_users = {user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 2000\n"
            "max_db_connections = 0\n"
            # Unused server connections of a test's database go away soon after its test.
            "server_idle_timeout = 30\n"
            f"logfile = {root / 'pgbouncer.log'}\n"
            f"pidfile = {root / 'pgbouncer.pid'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        if run_as is not None:
            # The pgbouncer user reads its files here; nothing secret (trust auth).
            os.chmod(root, 0o755)  # noqa: S103
            for path in (root, *root.iterdir()):
                os.chown(path, run_as.pw_uid, run_as.pw_gid)
        command = [binary, str(root / "pgbouncer.ini")]
        if run_as is not None:
            command = [binary, "-u", run_as.pw_name, str(root / "pgbouncer.ini")]
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        bouncer = PgBouncer("127.0.0.1", listen, root, process, pool_size)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with psycopg.connect(
                        bouncer.pooled(admin_url), connect_timeout=2, prepare_threshold=None
                    ) as conn:
                        conn.execute("SELECT 1")
                    break
                except psycopg.OperationalError as exc:
                    if process.poll() is not None or time.monotonic() > deadline:
                        stderr = process.stderr.read().decode() if process.stderr else ""
                        raise RuntimeError(
                            f"pgbouncer did not start: {exc}; {stderr} {bouncer.log()}"
                        ) from exc
                    time.sleep(0.05)
            yield bouncer
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
