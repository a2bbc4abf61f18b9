"""A throwaway Postgres cluster from local binaries, for tests and crash tests.

Crash tests restart Postgres, so they need a cluster of their own rather than a shared server.
Binaries are looked up in order: `pg_ctl` on PATH, /usr/lib/postgresql/*/bin, then the ones the
pgserver wheel ships. Postgres refuses to run as root, so as root the cluster runs as the
`postgres` system user when there is one (else a `ledgerloop` user is created).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgerloop.errors import LedgerloopError


class ClusterError(LedgerloopError):
    """The local Postgres cluster could not be started."""


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres."""
    on_path = shutil.which("pg_ctl")
    candidates: list[Path] = []
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    candidates += [Path(p) for p in versions]
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    # pgserver's own binaries last: importing it is slow and it is an optional fallback.
    for candidate in _pgserver_bin():
        if (candidate / "initdb").exists():
            return candidate
    raise ClusterError(
        "no Postgres binaries found (initdb, pg_ctl)",
        fix="install postgresql (apt-get install postgresql) or `pip install pgserver`",
    )


def _pgserver_bin() -> list[Path]:
    try:
        pgserver = import_pgserver()
    except ImportError:
        return []
    return [Path(pgserver.__file__).parent / "pginstall" / "bin"]


def import_pgserver() -> Any:
    """Import pgserver; it warns at import time when XDG_RUNTIME_DIR is unset, which is noise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "ledgerloop"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "ledgerloop"], check=True)
    return "ledgerloop"


@dataclass
class LocalCluster:
    """initdb + pg_ctl around one data directory, listening on 127.0.0.1 and a socket dir."""

    root: Path
    port: int = field(default_factory=free_port)
    bin_dir: Path = field(default_factory=find_bin_dir)
    user: str | None = field(default_factory=_run_as)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *args: str) -> list[str]:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        return [*prefix, *args]

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            # runuser needs to traverse every parent of the data directory.
            for parent in self.root.parents:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o011)
        subprocess.run(
            self._cmd(
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ),
            check=True,
            capture_output=True,
        )
        # Small shared memory and a few knobs that make throwaway clusters start fast.
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                "max_connections = 200\n"
                "shared_buffers = 64MB\n"
                "fsync = on\n"
                "max_wal_size = 1GB\n"
            )

    def start(self, timeout: float = 30.0) -> None:
        if not self.data_dir.exists():
            self.init()
        self._pg_ctl("start", timeout)

    def _pg_ctl(self, action: str, timeout: float, *options: str) -> None:
        """`pg_ctl action`, waiting up to `timeout` for the server; its log on failure."""
        proc = subprocess.run(
            self._cmd(
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.root / "postgres.log"),
                *options,
                "-w",
                "-t",
                str(int(timeout)),
                action,
            ),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            log = (self.root / "postgres.log").read_text()[-2000:] if self.root.exists() else ""
            raise ClusterError(f"pg_ctl {action} failed: {proc.stderr.strip()} {log}")

    def stop(self, mode: str = "fast") -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        subprocess.run(
            self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "stop"),
            capture_output=True,
            check=False,
        )

    def restart(self, mode: str = "immediate", timeout: float = 30.0) -> None:
        """Stop and start again (`pg_ctl restart -m mode`): every connection is cut, and the
        server answers again within about a second. `immediate` is a crash as far as the
        clients can tell (no shutdown checkpoint; recovery on start); `fast` a clean stop."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"restart mode {mode!r}: use 'smart', 'fast' or 'immediate'")
        self._pg_ctl("restart", timeout, "-m", mode)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crashed host would leave it."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text().splitlines()[0])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)

    def destroy(self) -> None:
        self.stop(mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)
