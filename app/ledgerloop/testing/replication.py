"""A primary and a streaming standby from local Postgres binaries, for failover tests.

`replicated_pair()` builds both clusters (the standby by `pg_basebackup` from the primary),
with the standby's replication connection through a TCP proxy the test controls:
`cut_replication()` closes it and refuses new ones, so the primary's later commits never
reach the standby and are lost when it is promoted (an asynchronous replica that lagged).
With `synchronous=True` the primary waits for the standby's flush before each commit returns
(nothing committed is lost); cutting replication then stalls commits, so a synchronous test
does not cut. `fail_over()` stops the primary at once (`-m immediate`, as a crashed host) and
promotes the standby; `multi_host_url()` names both, read-write first, as a client of a
managed service's failover would.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ledgerloop.db.cluster import ClusterError, LocalCluster, free_port


class ReplicationProxy:
    """Forwards TCP connections from a local port to `target`; `cut()` closes every
    connection and refuses new ones until `restore()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = True
        self._stopped = False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="replication-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or not self._open:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            sock.close()

    def cut(self) -> None:
        self._open = False
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            self._close(sock)

    def restore(self) -> None:
        self._open = True

    def stop(self) -> None:
        self._stopped = True
        self.cut()
        with suppress(OSError):
            self._listener.close()


@dataclass
class ReplicatedPair:
    primary: LocalCluster
    standby: LocalCluster
    proxy: ReplicationProxy
    synchronous: bool
    #: time.monotonic() when the standby's promotion returned (None before fail_over).
    promoted_at: float | None = None

    def multi_host_url(self, dbname: str) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write&connect_timeout=2"
        )

    def primary_url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary.port}/{dbname}"

    def standby_url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby.port}/{dbname}"

    def replay_lag_bytes(self) -> int:
        """How far the standby's replay is behind the primary's WAL (bytes)."""
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), -1) "
                "FROM pg_stat_replication"
            ).fetchone()
        return int(row[0]) if row else -1

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.replay_lag_bytes() != 0:
            if time.monotonic() > deadline:
                raise ClusterError(f"the standby did not catch up within {timeout:.0f} s")
            time.sleep(0.05)

    def cut_replication(self) -> None:
        """From now on the primary's commits do not reach the standby."""
        self.proxy.cut()

    def fail_over(self) -> float:
        """Stop the primary at once and promote the standby; returns time.monotonic() when
        the standby accepts writes."""
        self.primary.stop(mode="immediate")
        subprocess.run(
            self.standby._cmd(
                str(self.standby.bin_dir / "pg_ctl"),
                "-D",
                str(self.standby.data_dir),
                "-w",
                "-t",
                "60",
                "promote",
            ),
            check=True,
            capture_output=True,
        )
        self.promoted_at = time.monotonic()
        return self.promoted_at

    def timeline(self, url: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
            ).fetchone()
        assert row is not None
        return int(row[0])


def _basebackup(primary: LocalCluster, port: int, into: Path) -> None:
    proc = subprocess.run(
        primary._cmd(
            str(primary.bin_dir / "pg_basebackup"),
            "-D",
            str(into),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",
            "--no-sync",
        ),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ClusterError(f"pg_basebackup failed: {proc.stderr.strip()}")


@contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[ReplicatedPair]:
    """A running primary and a streaming standby (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="ledgerloop-failover-") as tmp:
        root = Path(tmp)
        primary = LocalCluster(root / "primary")
        primary.init()
        with (primary.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = 256MB\n"
                "hot_standby = on\nwal_sender_timeout = 5s\n"
                + ("synchronous_standby_names = '*'\n" if synchronous else "")
            )
        primary.start()
        proxy = ReplicationProxy(primary.port)
        standby = LocalCluster(root / "standby", port=free_port())
        try:
            standby.root.mkdir(parents=True, exist_ok=True)
            if standby.user:
                entry = pwd.getpwnam(standby.user)
                os.chown(standby.root, entry.pw_uid, entry.pw_gid)
            _basebackup(primary, proxy.port, standby.data_dir)
            with (standby.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"\nport = {standby.port}\nunix_socket_directories = '{standby.root}'\n"
                    "synchronous_standby_names = ''\nwal_receiver_timeout = 5s\n"
                    "wal_retrieve_retry_interval = 1s\n"
                )
            standby.start()
            pair = ReplicatedPair(primary, standby, proxy, synchronous)
            pair.wait_caught_up()
            yield pair
        finally:
            proxy.stop()
            standby.stop(mode="immediate")
            primary.stop(mode="immediate")
            shutil.rmtree(root, ignore_errors=True)
