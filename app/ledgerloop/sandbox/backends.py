"""How each backend runs one command: its command line, its limits, how to kill it.

Both backends give the guest the same view:

- a read-only root made of an empty skeleton, `/usr` (the interpreter and its libraries) and
  the host paths the policy lists, all read-only;
- `/work`, the sandbox's scratch working directory, the only writable place;
- a read-only `/dev` holding null, zero, random and urandom (the host's devices) and the
  fd/stdin/stdout/stderr links: no tty, no pty, no `/dev/shm` (an in-memory filesystem there
  would hold memory that no limit counts);
- no network but its own loopback (a new network namespace; gVisor's `--network=none`);
- no environment from the worker: PATH, HOME=/work and TMPDIR=/work only.

Limits: the wall-clock limit is kept by the host (it kills the container); memory (address
space), CPU seconds, file size and process count are rlimits. gVisor applies rlimits inside
its own kernel. For bubblewrap the process count is RLIMIT_NPROC, which Linux counts per host
user: the worker (as root) runs each sandbox as an unprivileged uid leased to that sandbox
alone while it lives (ledgerloop.sandbox.uids), so the count is the sandbox's alone. A worker
that is not root cannot do that, and bwrap refuses to run for it.

A bubblewrap command is killed through its pid namespace: SIGKILL to bwrap reaches the
namespace's init (--die-with-parent), and the kernel kills everything else in the namespace
when its init dies. Nothing outside the command's namespace is signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ledgerloop.sandbox.errors import SandboxUnavailable
from ledgerloop.sandbox.uids import live_processes

GUEST_WORKDIR = "/work"
GUEST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": GUEST_WORKDIR, "TMPDIR": GUEST_WORKDIR}
#: Host paths every guest sees read-only (the interpreter); the policy may add more.
SYSTEM_PATHS = ("/usr",)
#: bwrap's own processes in the sandbox user's count: bwrap and its pid-namespace init.
BWRAP_OWN_PROCESSES = 2
#: The host devices a guest gets in its /dev (bound one by one; /dev itself is read-only).
GUEST_DEVICES = ("null", "zero", "random", "urandom")
#: The links every /dev has, which shells and programs open (`<(...)`, /dev/stdout).
GUEST_DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}


@dataclass(frozen=True)
class Limits:
    """What one command may use. Every field is enforced (see the module docstring)."""

    time_s: float = 30.0
    memory_mb: int = 512
    output_bytes: int = 1024 * 1024
    processes: int = 64
    file_mb: int = 64

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 1024 * 1024

    @property
    def cpu_s(self) -> int:
        # A backstop under the wall-clock limit the host keeps.
        return int(self.time_s) + 1

    @property
    def file_bytes(self) -> int:
        return self.file_mb * 1024 * 1024


@dataclass(frozen=True)
class CommandSpec:
    """One command in one sandbox, as a backend needs it."""

    sandbox_dir: Path
    container_id: str
    argv: tuple[str, ...]
    limits: Limits
    read_only_paths: tuple[str, ...] = ()
    #: The host uid (and gid) the command runs as (the sandbox's lease); None keeps the
    #: worker's.
    uid: int | None = None

    @property
    def work(self) -> Path:
        return self.sandbox_dir / "work"

    @property
    def rootfs(self) -> Path:
        return self.sandbox_dir / "rootfs"

    def ro_paths(self) -> list[str]:
        return [*SYSTEM_PATHS, *self.read_only_paths]


class Backend(Protocol):
    name: ClassVar[str]
    #: Whether each sandbox runs as a host uid of its own (leased by the host).
    own_uid: ClassVar[bool]

    def missing(self) -> str | None:
        """Why this backend cannot run here, or None when it can."""

    def command(self, spec: CommandSpec, state_dir: Path) -> list[str]:
        """The host command line that runs spec.argv in the sandbox."""

    async def kill(self, spec: CommandSpec, state_dir: Path, pid: int) -> None:
        """Stop the command and everything it started."""


class Bwrap:
    name: ClassVar[str] = "bwrap"
    own_uid: ClassVar[bool] = True

    def missing(self) -> str | None:
        if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
            return "bubblewrap is not installed (bwrap and prlimit on PATH)"
        if os.geteuid() != 0:
            return (
                "bwrap enforces the process limit only when the worker runs as root (it runs "
                "each sandbox as its own uid); use sandbox: gvisor"
            )
        return None

    def command(self, spec: CommandSpec, state_dir: Path) -> list[str]:
        limits = spec.limits
        argv = [
            "prlimit",
            f"--nproc={limits.processes + BWRAP_OWN_PROCESSES}",
            f"--as={limits.memory_bytes}",
            f"--cpu={limits.cpu_s}",
            f"--fsize={limits.file_bytes}",
            "--nofile=256",
            "--",
            "bwrap",
            "--unshare-all",  # user, pid, net (loopback only), ipc, uts, cgroup
            "--die-with-parent",
            "--new-session",
            "--ro-bind",
            str(spec.rootfs),
            "/",
        ]
        for path in spec.ro_paths():
            argv += ["--ro-bind", path, path]
        argv += ["--proc", "/proc"]
        # Not --dev, which mounts a writable tmpfs (an unbounded /dev/shm with it) and a tty:
        # the skeleton's /dev is read-only and has a mount point for each device.
        for device in GUEST_DEVICES:
            argv += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
        argv += ["--bind", str(spec.work), GUEST_WORKDIR]
        argv += ["--chdir", GUEST_WORKDIR, "--clearenv"]
        for key, value in GUEST_ENV.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *spec.argv]

    async def kill(self, spec: CommandSpec, state_dir: Path, pid: int) -> None:
        # bwrap's death reaches its pid namespace's init (--die-with-parent), and the kernel
        # kills the rest of the namespace with it: this command's processes and no others.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


class Gvisor:
    name: ClassVar[str] = "gvisor"
    own_uid: ClassVar[bool] = False
    #: ptrace works everywhere (no /dev/kvm needed), nested in a VM included.
    platform: ClassVar[str] = os.environ.get("LEDGERLOOP_RUNSC_PLATFORM", "ptrace")

    def missing(self) -> str | None:
        if shutil.which("runsc") is None:
            return "gVisor is not installed (runsc on PATH)"
        return None

    def base(self, state_dir: Path) -> list[str]:
        return [
            "runsc",
            "--rootless",
            "--network=none",
            "--overlay2=none",  # the root stays read-only, not a writable in-memory overlay
            f"--platform={self.platform}",
            "--root",
            str(state_dir),
        ]

    def command(self, spec: CommandSpec, state_dir: Path) -> list[str]:
        bundle = spec.sandbox_dir / "bundles" / spec.container_id
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(self.oci_config(spec)))
        return [*self.base(state_dir), "run", "--bundle", str(bundle), spec.container_id]

    def oci_config(self, spec: CommandSpec) -> dict[str, Any]:
        limits = spec.limits
        rlimits = [
            ("RLIMIT_NPROC", limits.processes),
            ("RLIMIT_AS", limits.memory_bytes),
            ("RLIMIT_CPU", limits.cpu_s),
            ("RLIMIT_FSIZE", limits.file_bytes),
            ("RLIMIT_NOFILE", 256),
        ]
        mounts: list[dict[str, Any]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            # runsc's default /dev is a writable tmpfs (an unbounded /dev/shm in it, held in the
            # sandbox's memory outside any rlimit) with a tty and ptys. The skeleton's /dev
            # instead, read-only, with the host's devices bound on their mount points. A
            # read-only tmpfs will not do: gVisor refuses to open its /dev/null for writing.
            {
                "destination": "/dev",
                "type": "bind",
                "source": str(spec.rootfs / "dev"),
                "options": ["rbind", "ro"],
            },
            # runsc mounts a devpts here whatever /dev is: an empty read-only directory over it.
            {
                "destination": "/dev/pts",
                "type": "bind",
                "source": str(spec.rootfs / "dev" / "pts"),
                "options": ["rbind", "ro"],
            },
            # gVisor mounts a writable tmpfs on /tmp unless told otherwise: keep it read-only.
            {
                "destination": "/tmp",  # noqa: S108
                "type": "bind",
                "source": str(spec.rootfs / "tmp"),
                "options": ["rbind", "ro"],
            },
        ]
        for device in GUEST_DEVICES:
            # Only /dev/null is written to; the others are read (writing is refused).
            mode = "rw" if device == "null" else "ro"
            mounts.append(
                {
                    "destination": f"/dev/{device}",
                    "type": "bind",
                    "source": f"/dev/{device}",
                    "options": ["bind", mode],
                }
            )
        for path in spec.ro_paths():
            mounts.append(
                {"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]}
            )
        mounts.append(
            {
                "destination": GUEST_WORKDIR,
                "type": "bind",
                "source": str(spec.work),
                "options": ["rbind", "rw"],
            }
        )
        return {
            "ociVersion": "1.0.0",
            "process": {
                "args": list(spec.argv),
                "env": [f"{k}={v}" for k, v in GUEST_ENV.items()],
                "cwd": GUEST_WORKDIR,
                "user": {"uid": 0, "gid": 0},
                "rlimits": [{"type": t, "hard": v, "soft": v} for t, v in rlimits],
            },
            "root": {"path": str(spec.rootfs), "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": kind} for kind in ("pid", "ipc", "uts", "mount", "network")]
            },
        }

    async def kill(self, spec: CommandSpec, state_dir: Path, pid: int) -> None:
        await runsc_delete(self, state_dir, spec.container_id)


async def runsc_delete(backend: Gvisor, state_dir: Path, container_id: str) -> None:
    """Kill a gVisor container and remove its state (a no-op for one already gone).

    SIGKILL first: `delete --force` on a running container waits seconds for it to stop.
    """
    for args in (("kill", container_id, "KILL"), ("delete", "--force", container_id)):
        proc = await asyncio.create_subprocess_exec(
            *backend.base(state_dir),
            *args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await proc.wait()


def kill_uid(uid: int) -> int:
    """SIGKILL every process of a host uid; returns how many were signalled."""
    killed = 0
    for pid in processes_of_uid(uid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 9)
            killed += 1
    return killed


def processes_of_uid(uid: int) -> list[int]:
    """The live (not zombie) processes of a host uid."""
    return [pid for pid, owner in live_processes() if owner == uid]


BACKENDS: dict[str, Backend] = {"gvisor": Gvisor(), "bwrap": Bwrap()}


def require_backend(name: str) -> Backend:
    """The named backend, or one clear error saying what to install or choose instead."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise SandboxUnavailable(
            f"unknown sandbox backend {name!r}", fix="use sandbox: gvisor or sandbox: bwrap"
        )
    reason = backend.missing()
    if reason is None:
        return backend
    others = [
        other.name for other in BACKENDS.values() if other is not backend and not other.missing()
    ]
    hint = f"or choose sandbox: {others[0]}" if others else "no other backend works here either"
    raise SandboxUnavailable(
        f"sandbox backend {name} cannot run: {reason}",
        fix=f"install the Debian packages with scripts/install-sandbox ({hint})",
    )
