"""Sandboxes on this host: a directory each, one short-lived container per command.

    {root}/{sandbox_id}/sandbox.json   run, backend, read-only paths, owner (pid + start time),
                                       the uid leased to it (bwrap)
    {root}/{sandbox_id}/work/          the guest's /work (the only writable place)
    {root}/{sandbox_id}/rootfs/        an empty read-only skeleton for the guest's /
    {root}/{sandbox_id}/commands/      one file per running command (pid, container id)
    {root}/.runsc/                     gVisor's container state

Between commands nothing runs: a sandbox is its working directory. So a run that waits holds
no process, and a worker killed mid-command leaves at most that command's container, which
the reaper finds by its command file (the owner it names is dead) and destroys.

Everything the guest wrote is untrusted: files are read with O_NOFOLLOW and only when their
real path is inside the working directory, written by unlinking first (never through a link
the guest planted), and snapshots extract with tarfile's "data" filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import io
import json
import logging
import os
import shutil
import stat
import tarfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ledgerloop import faults
from ledgerloop.sandbox.backends import (
    BACKENDS,
    GUEST_DEV_LINKS,
    GUEST_DEVICES,
    Backend,
    CommandSpec,
    Gvisor,
    Limits,
    kill_uid,
    require_backend,
    runsc_delete,
)
from ledgerloop.sandbox.errors import SandboxError, SandboxGone
from ledgerloop.sandbox.uids import UidLeases

log = logging.getLogger(__name__)

SKELETON_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
SKELETON_DIRS = ("usr", "proc", "dev", "work", "etc", "tmp")
#: Read in chunks; what passes the output limit is counted and dropped, never held.
CHUNK = 65536

__all__ = ["ExecResult", "Limits", "Sandbox", "SandboxHost"]


@dataclass(frozen=True)
class Sandbox:
    id: str
    run_id: str
    backend: str
    path: Path
    read_only_paths: tuple[str, ...] = ()
    #: The host uid leased to it, for a backend that runs each sandbox as its own uid.
    uid: int | None = None

    @property
    def work(self) -> Path:
        return self.path / "work"


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    #: The guest wrote more than limits.output_bytes; the rest was dropped.
    truncated: bool
    output_bytes: int
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "timed_out": self.timed_out,
            "output_truncated": self.truncated,
            "output_bytes": self.output_bytes,
        }


def process_start(pid: int) -> str | None:
    """The start time of a process (its identity with the pid); None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()[19]


def _alive(owner: Mapping[str, Any] | None) -> bool:
    if not owner:
        return False
    return process_start(int(owner["pid"])) == owner.get("start")


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "start": process_start(os.getpid())}


def safe_name(name: str) -> str:
    """A file name in the working directory: one plain component, nothing that climbs out."""
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise SandboxError(
            f"{name!r} is not a plain file name", fix="name files in /work without slashes"
        )
    return name


class SandboxHost:
    def __init__(self, root: Path, uid_leases: UidLeases | None = None) -> None:
        self.root = root.resolve()
        self.state_dir = self.root / ".runsc"
        self.uids = uid_leases or UidLeases()

    # -- lifecycle ------------------------------------------------------------------------

    def create(
        self,
        sandbox_id: str,
        *,
        run_id: str,
        backend: str,
        files: Mapping[str, bytes] = {},
        read_only_paths: Iterable[str] = (),
        snapshot: bytes | None = None,
    ) -> Sandbox:
        """Make (or remake, for a retried step) the sandbox's directory and its files."""
        chosen = require_backend(backend)
        paths = tuple(read_only_paths)
        for listed in paths:
            if not Path(listed).is_absolute() or not Path(listed).exists():
                raise SandboxError(
                    f"read-only path {listed!r} does not exist on this host",
                    fix="list absolute host paths that exist in the tool's read_only_paths",
                )
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        if chosen.own_uid:
            _check_reachable(self.root)
        path = self.root / sandbox_id
        if path.exists():
            self._remove(path)
        path.mkdir(mode=0o711)
        # After the directory exists: a lease naming a missing directory is stale.
        uid = self.uids.acquire(path) if chosen.own_uid else None
        rootfs = path / "rootfs"
        rootfs.mkdir(mode=0o755)
        for name in SKELETON_DIRS:
            (rootfs / name).mkdir(mode=0o755)
        for name, target in SKELETON_LINKS.items():
            (rootfs / name).symlink_to(target)
        _furnish_dev(rootfs / "dev")
        for extra in paths:
            (rootfs / extra.lstrip("/")).mkdir(mode=0o755, parents=True, exist_ok=True)
        rootfs.chmod(0o555)
        (path / "commands").mkdir(mode=0o700)
        work = path / "work"
        work.mkdir(mode=0o700)
        sandbox = Sandbox(sandbox_id, run_id, chosen.name, path, paths, uid)
        self._write_meta(sandbox)
        if snapshot is not None:
            with tarfile.open(fileobj=io.BytesIO(snapshot), mode="r:gz") as tar:
                tar.extractall(work, filter="data")
        for name, data in files.items():
            self.put_file(sandbox, name, data)
        return self._own(sandbox, chosen)

    def get(self, sandbox_id: str) -> Sandbox:
        meta = self._read_meta(self.root / sandbox_id)
        if meta is None:
            raise SandboxGone(
                f"sandbox {sandbox_id} does not exist on this host",
                fix="it was destroyed, or the run moved to another host",
            )
        return Sandbox(
            sandbox_id,
            str(meta["run_id"]),
            str(meta["backend"]),
            self.root / sandbox_id,
            tuple(meta.get("read_only_paths") or ()),
            meta.get("uid"),
        )

    def exists(self, sandbox_id: str) -> bool:
        return (self.root / sandbox_id / "sandbox.json").is_file()

    async def destroy(self, sandbox_id: str) -> bool:
        """Kill whatever runs in it and remove it; False when it was already gone."""
        path = self.root / sandbox_id
        if not path.exists():
            return False
        await self._kill_commands(path)
        uid = (self._read_meta(path) or {}).get("uid")
        self._remove(path)
        if uid is not None:
            # Only once the directory is gone: until then its files are the uid's, and a
            # sandbox handed the uid now could reach them.
            self.uids.release(path, int(uid))
        return True

    def ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "sandbox.json").is_file())

    # -- files ----------------------------------------------------------------------------

    def put_file(self, sandbox: Sandbox, name: str, data: bytes) -> None:
        target = sandbox.work / safe_name(name)
        with contextlib.suppress(FileNotFoundError):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if sandbox.uid is not None:
            os.chown(target, sandbox.uid, sandbox.uid, follow_symlinks=False)

    def collect(
        self, sandbox: Sandbox, patterns: Iterable[str], max_bytes: int
    ) -> dict[str, bytes]:
        """The regular files in the working directory matching the patterns (no links)."""
        wanted = tuple(patterns)
        found: dict[str, bytes] = {}
        if not wanted:
            return found
        work = sandbox.work.resolve()
        for entry in sorted(work.rglob("*")):
            name = entry.relative_to(work).as_posix()
            if not any(fnmatch.fnmatch(name, pattern) for pattern in wanted):
                continue
            if entry.is_symlink() or not entry.resolve().is_relative_to(work):
                continue
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    continue
                found[name] = handle.read(max_bytes + 1)[: max_bytes + 1]
        return found

    def snapshot(self, sandbox: Sandbox, max_bytes: int) -> bytes:
        """The working directory as a gzipped tar (links kept as links, never followed)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for entry in sorted(sandbox.work.iterdir()):
                tar.add(entry, arcname=entry.name)
        data = buffer.getvalue()
        if len(data) > max_bytes:
            raise SandboxError(
                f"the working directory packs to {len(data)} bytes, over the {max_bytes} a "
                "waiting run may keep",
                fix="have the code keep less in /work, or raise the tool's limits.snapshot_mb",
            )
        return data

    # -- commands -------------------------------------------------------------------------

    async def exec(self, sandbox: Sandbox, argv: list[str], limits: Limits) -> ExecResult:
        """Run one command in the sandbox within its limits. Never raises for the guest's
        own failures (exit codes, timeouts, limits): those are the result."""
        backend = require_backend(sandbox.backend)
        if not sandbox.work.is_dir():
            raise SandboxGone(f"sandbox {sandbox.id} has no working directory")
        sandbox = self._own(sandbox, backend)
        # A sandbox made by an earlier version has an empty /dev in its skeleton.
        _furnish_dev(sandbox.path / "rootfs" / "dev")
        spec = CommandSpec(
            sandbox_dir=sandbox.path,
            container_id=f"ll-{sandbox.id}-{uuid.uuid4().hex[:8]}",
            argv=tuple(argv),
            limits=limits,
            read_only_paths=sandbox.read_only_paths,
            uid=sandbox.uid,
        )
        command = backend.command(spec, self.state_dir)
        started = time.monotonic()
        drop: dict[str, Any] = {}
        if spec.uid is not None:
            drop = {"user": spec.uid, "group": spec.uid, "extra_groups": []}
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
            **drop,
        )
        marker = sandbox.path / "commands" / spec.container_id
        marker.write_text(
            json.dumps({"pid": proc.pid, "start": process_start(proc.pid), "uid": spec.uid})
        )
        output = _Output(limits.output_bytes)
        streams = [
            asyncio.ensure_future(output.read(proc.stdout, output.stdout)),
            asyncio.ensure_future(output.read(proc.stderr, output.stderr)),
        ]
        timed_out = False
        try:
            faults.hit("sandbox.during_command")
            try:
                async with asyncio.timeout(limits.time_s):
                    # asyncio.wait, not gather: the timeout must not cancel the readers while
                    # the guest's last words may still be in the pipes.
                    await asyncio.wait(streams)
                    await proc.wait()
            except TimeoutError:
                timed_out = True
                await backend.kill(spec, self.state_dir, proc.pid)
                await proc.wait()
                # The pipes close with the container: read what it wrote before the kill.
                await asyncio.wait(streams, timeout=2.0)
        except BaseException:
            # Cancelled (the run was stopped) or failed: the command must not outlive us.
            await backend.kill(spec, self.state_dir, proc.pid)
            raise
        finally:
            # What the readers took so far is kept in `output` whether or not they finished.
            for task in streams:
                task.cancel()
            if isinstance(backend, Gvisor):
                await runsc_delete(backend, self.state_dir, spec.container_id)
            # bwrap: the command's pid namespace died with its init (see Bwrap.kill); no
            # sweep of the sandbox's uid, which another command of the sandbox may be using.
            marker.unlink(missing_ok=True)
        return ExecResult(
            exit_code=proc.returncode if proc.returncode is not None else -9,
            stdout=output.stdout.decode("utf-8", "replace"),
            stderr=output.stderr.decode("utf-8", "replace"),
            timed_out=timed_out,
            truncated=output.seen > limits.output_bytes,
            output_bytes=output.seen,
            duration_s=time.monotonic() - started,
        )

    def running(self) -> list[int]:
        """Pids of the commands running in this host's sandboxes (for operators and tests)."""
        pids = []
        for sandbox_id in self.ids():
            for marker in (self.root / sandbox_id / "commands").glob("ll-*"):
                with contextlib.suppress(OSError, ValueError):
                    info = json.loads(marker.read_text())
                    if process_start(int(info["pid"])) == info.get("start"):
                        pids.append(int(info["pid"]))
        return pids

    # -- the reaper -----------------------------------------------------------------------

    async def reap(self, run_status: Callable[[str], str | None]) -> list[str]:
        """Destroy what dead workers left behind; returns the ids of sandboxes destroyed.

        A sandbox whose owner is dead loses its running commands. Its directory stays while
        its run may still resume (the run destroys it when it ends); a sandbox whose run is
        over (finished, cancelled from outside, or gone) is destroyed whoever owns it.
        """
        destroyed = []
        for sandbox_id in self.ids():
            path = self.root / sandbox_id
            meta = self._read_meta(path)
            if meta is None:
                continue
            status = run_status(str(meta["run_id"]))
            over = status is None or status in ("succeeded", "failed", "cancelled")
            if over:
                if await self.destroy(sandbox_id):
                    destroyed.append(sandbox_id)
                continue
            if not _alive(meta.get("owner")):
                await self._kill_commands(path)
        await self._reap_containers()
        return destroyed

    async def _reap_containers(self) -> None:
        """gVisor containers whose sandbox is gone or whose command file is gone."""
        gvisor = BACKENDS["gvisor"]
        if not isinstance(gvisor, Gvisor) or gvisor.missing() or not self.state_dir.is_dir():
            return
        proc = await asyncio.create_subprocess_exec(
            *gvisor.base(self.state_dir),
            "list",
            "--quiet",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await proc.communicate()
        live = set(self.running_containers())
        for container in out.decode().split():
            if container.startswith("ll-") and container not in live:
                await runsc_delete(gvisor, self.state_dir, container)

    def running_containers(self) -> list[str]:
        names = []
        for sandbox_id in self.ids():
            for marker in (self.root / sandbox_id / "commands").glob("ll-*"):
                with contextlib.suppress(OSError, ValueError):
                    info = json.loads(marker.read_text())
                    if process_start(int(info["pid"])) == info.get("start"):
                        names.append(marker.name)
        return names

    # -- internals ------------------------------------------------------------------------

    async def _kill_commands(self, path: Path) -> None:
        meta = self._read_meta(path) or {}
        backend = BACKENDS.get(str(meta.get("backend")))
        for marker in (path / "commands").glob("ll-*"):
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(marker.read_text())
                pid = int(info["pid"])
                if process_start(pid) == info.get("start"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, 9)
                if isinstance(backend, Gvisor) and not backend.missing():
                    await runsc_delete(backend, self.state_dir, marker.name)
            marker.unlink(missing_ok=True)
        uid = meta.get("uid")
        if isinstance(uid, int) and self.uids.holder(uid) == path:
            # While the sandbox holds its lease, the uid is its alone: this reaches its
            # processes (a command whose worker died included) and nobody else's.
            kill_uid(uid)

    def _own(self, sandbox: Sandbox, backend: Backend) -> Sandbox:
        """Record this worker as the sandbox's owner; for a backend that runs sandboxes as
        their own uid, make sure the sandbox still holds its lease and /work is that uid's."""
        if backend.own_uid:
            uid = self.uids.acquire(sandbox.path, prefer=sandbox.uid)
            if uid != sandbox.uid:
                # Made before uids were leased, or its lease was lost (the lease directory
                # is under /run, emptied by a reboot): a new uid, and /work handed over to it.
                _chown_tree(sandbox.work, uid)
                sandbox = replace(sandbox, uid=uid)
            os.chown(sandbox.work, uid, uid)
        meta = self._read_meta(sandbox.path) or {}
        if meta.get("owner") != _me() or meta.get("uid") != sandbox.uid:
            self._write_meta(sandbox)
        return sandbox

    def _write_meta(self, sandbox: Sandbox) -> None:
        meta = {
            "run_id": sandbox.run_id,
            "backend": sandbox.backend,
            "read_only_paths": list(sandbox.read_only_paths),
            "owner": _me(),
            "uid": sandbox.uid,
        }
        tmp = sandbox.path / "sandbox.json.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(sandbox.path / "sandbox.json")

    @staticmethod
    def _read_meta(path: Path) -> dict[str, Any] | None:
        try:
            value = json.loads((path / "sandbox.json").read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    @staticmethod
    def _remove(path: Path) -> None:
        rootfs = path / "rootfs"
        if rootfs.is_dir() and not rootfs.is_symlink():
            rootfs.chmod(0o755)
        shutil.rmtree(path, ignore_errors=True)


def _check_reachable(root: Path) -> None:
    """A sandbox's own uid must be able to pass through every directory above its own."""
    for directory in (root, *root.parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            raise SandboxError(
                f"sandbox root {root} is under {directory}, which other users cannot enter",
                fix="set LEDGERLOOP_SANDBOX_ROOT to a directory under one they can (e.g. /tmp)",
            )


def _furnish_dev(dev: Path) -> None:
    """The skeleton's /dev (read-only in the guest): a mount point for each device the
    backends bind, the usual links, and an empty pts (gVisor covers its devpts with it)."""
    (dev / "pts").mkdir(mode=0o755, exist_ok=True)
    for device in GUEST_DEVICES:
        (dev / device).touch(mode=0o644, exist_ok=True)
    for name, target in GUEST_DEV_LINKS.items():
        if not (dev / name).is_symlink():
            (dev / name).symlink_to(target)


def _chown_tree(top: Path, uid: int) -> None:
    """Give a directory and everything under it to uid, following no link (nothing of the
    sandbox runs while this happens: it is called before a command starts)."""
    os.chown(top, uid, uid, follow_symlinks=False)
    for directory, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(directory, name), uid, uid, follow_symlinks=False)


class _Output:
    """stdout and stderr as the guest writes them, kept up to one shared budget.

    Kept here as it is read, not returned by the readers at their end: a reader stopped by a
    timeout or a cancel has still kept everything it read (a command that prints and then
    loops keeps what it printed).
    """

    def __init__(self, budget: int) -> None:
        self.room = budget
        self.seen = 0
        self.stdout = bytearray()
        self.stderr = bytearray()

    async def read(self, stream: asyncio.StreamReader | None, kept: bytearray) -> None:
        """Read a stream to its end; what passes the budget is counted and dropped."""
        if stream is None:
            return
        while chunk := await stream.read(CHUNK):
            self.seen += len(chunk)
            if self.room > 0:
                kept += chunk[: self.room]
                self.room -= min(self.room, len(chunk))
