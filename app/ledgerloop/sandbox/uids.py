"""Host uids for bubblewrap sandboxes: one per live sandbox, leased, never shared.

bubblewrap's process limit is RLIMIT_NPROC, which Linux counts per host user, and a sandbox's
files in /work belong to its uid: two live sandboxes with one uid would share the process
limit and each other's files. So a uid is handed out by a lease, not derived from the sandbox
id (a hash of ids into a range collides within a few hundred sandboxes):

    {directory}/.lock     flock'd while a lease is taken or given back (every worker on the host)
    {directory}/{uid}     a lease: the path of the sandbox directory holding it

A lease is given back when its sandbox is destroyed. One whose sandbox directory no longer
exists (removed by hand, or the machine lost it) is stale and taken back by the next
acquire. A uid that has a live process is never handed out, leased or not: it may be a
process of a sandbox whose lease was lost, or of something else on the host using the range.

The directory is host-wide (not under a worker's sandbox root) so that workers with different
roots on one host still never share a uid. Workers in separate containers on one kernel (no
user namespace between them) must be given one directory they all see, with
LEDGERLOOP_SANDBOX_UID_LEASES, and see each other's sandbox roots at the same paths (a lease
whose sandbox directory is not there is stale).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ledgerloop.sandbox.errors import SandboxError

FIRST_UID = 200_000
#: The range sandboxes' uids come from: far above any real user's.
UID_COUNT = 60_000
#: Root-only on every distribution that has it; bwrap sandboxes need a root worker anyway.
DEFAULT_DIRECTORY = Path("/run/ledgerloop-sandbox-uids")


class UidLeases:
    def __init__(self, directory: Path | None = None) -> None:
        configured = os.environ.get("LEDGERLOOP_SANDBOX_UID_LEASES")
        self.directory = directory or (Path(configured) if configured else DEFAULT_DIRECTORY)

    def acquire(self, owner: Path, prefer: int | None = None) -> int:
        """The uid leased to the sandbox directory `owner`: the one it holds already (a
        retried create, every command), else `prefer` when that is free, else a free one."""
        if prefer is not None and self.holder(prefer) == owner:
            return prefer  # only release(owner) or owner's directory going can undo this
        owner_name = str(owner)
        with self._locked():
            leases = self._leases()
            for uid, holder in leases.items():
                if holder == owner_name:
                    return uid
            busy = uids_with_processes()

            def free(uid: int) -> bool:
                holder = leases.get(uid)
                return (holder is None or not Path(holder).is_dir()) and uid not in busy

            candidates = range(FIRST_UID, FIRST_UID + UID_COUNT)
            if prefer is not None and prefer in candidates and free(prefer):
                candidates = range(prefer, prefer + 1)
            for uid in candidates:
                if free(uid):
                    self._write(uid, owner_name)
                    return uid
        raise SandboxError(
            f"all {UID_COUNT} sandbox uids are leased to live sandboxes on this host",
            fix="let runs finish (their sandboxes give their uids back), or remove stale "
            f"sandbox directories; leases are in {self.directory}",
        )

    def release(self, owner: Path, uid: int) -> None:
        """Give the uid back, if `owner` still holds it."""
        with self._locked():
            if self.holder(uid) == owner:
                (self.directory / str(uid)).unlink(missing_ok=True)

    def holder(self, uid: int) -> Path | None:
        """The sandbox directory the uid is leased to, or None."""
        try:
            return Path((self.directory / str(uid)).read_text())
        except OSError:
            return None

    def _leases(self) -> dict[int, str]:
        leases = {}
        for entry in self.directory.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    leases[int(entry.name)] = entry.read_text()
        return leases

    def _write(self, uid: int, owner: str) -> None:
        tmp = self.directory / f".{uid}.tmp"
        tmp.write_text(owner)
        tmp.replace(self.directory / str(uid))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._prepare()
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def _prepare(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Whoever can write here can hand two sandboxes one uid: it must be ours alone.
        info = self.directory.lstat()
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.geteuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise SandboxError(
                f"the uid lease directory {self.directory} is not a directory only this "
                "worker's user can write",
                fix=f"remove {self.directory} (the worker recreates it) or set it to mode 0700",
            )


def uids_with_processes() -> set[int]:
    """The real uids of the host's live (not zombie) processes."""
    return {uid for _, uid in live_processes()}


def live_processes() -> Iterator[tuple[int, int]]:
    """(pid, real uid) of each of the host's live processes, zombies left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        state = uid = None
        for line in status.splitlines():
            if line.startswith("State:"):
                state = line.split()[1]
            elif line.startswith("Uid:"):
                uid = int(line.split()[1])
        # A zombie has already exited: it only waits for its parent to collect its status.
        if uid is not None and state != "Z":
            yield int(entry.name), uid
