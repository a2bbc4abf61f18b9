"""What a sandbox leaves behind, looked for from outside its host's bookkeeping.

`SandboxHost.running()` reads the host's own command files; these read runsc's state and
/proc, so a command the host lost track of still shows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ledgerloop.sandbox import SandboxHost
from ledgerloop.sandbox.backends import Gvisor


def gvisor_containers(host: SandboxHost) -> list[str]:
    """The gVisor containers runsc still knows under this host's state directory."""
    if not host.state_dir.is_dir():
        return []
    listed = subprocess.run(
        [*Gvisor().base(host.state_dir), "list", "--quiet"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def processes_naming(path: Path) -> list[int]:
    """Live processes whose command line names `path`: bwrap and prlimit name the sandbox's
    directories, runsc and its gofer and sandbox processes its state directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(path).encode() in cmdline:
            found.append(int(entry.name))
    return found


def leased_uids(host: SandboxHost) -> list[int]:
    """The uids leased to sandboxes under this host's root (none once they are destroyed)."""
    directory = host.uids.directory
    if not directory.is_dir():
        return []
    found = []
    for lease in directory.iterdir():
        try:
            holder = Path(lease.read_text())
        except OSError:  # given back meanwhile (other hosts' sandboxes share the directory)
            continue
        if lease.name.isdigit() and holder.is_relative_to(host.root):
            found.append(int(lease.name))
    return sorted(found)
