"""Uids for bubblewrap sandboxes: leased one per live sandbox, never shared, given back.

Real files, real flock, real processes (a uid with a live process is never handed out).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerloop.sandbox import Limits, SandboxError, SandboxHost
from ledgerloop.sandbox.uids import FIRST_UID, UidLeases, uids_with_processes
from ledgerloop.testing.postgres import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="leases and bwrap uids need root")


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Not under pytest's tmp_path: a sandbox's own uid must be able to reach its directory.
    path = Path(tempfile.mkdtemp(prefix="ll-sandbox-uids-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def leases(scratch: Path) -> UidLeases:
    # A lease directory of the test's own: the host-wide one is shared with running workers.
    return UidLeases(scratch / "leases")


def _owners(scratch: Path, count: int) -> list[Path]:
    owners = []
    for n in range(count):
        owner = scratch / f"sandbox-{n}"
        owner.mkdir()
        owners.append(owner)
    return owners


def test_concurrent_acquires_never_hand_out_one_uid_twice(scratch: Path, leases: UidLeases) -> None:
    owners = _owners(scratch, 200)
    got: dict[Path, int] = {}
    start = threading.Barrier(8)

    def take(mine: list[Path]) -> None:
        start.wait()
        for owner in mine:
            got[owner] = leases.acquire(owner)

    threads = [threading.Thread(target=take, args=(owners[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(got) == 200
    assert len(set(got.values())) == 200
    assert all(leases.holder(uid) == owner for owner, uid in got.items())
    # A sandbox asking again (a retried create, each command) keeps the uid it holds.
    assert leases.acquire(owners[7]) == got[owners[7]]
    assert leases.acquire(owners[7], prefer=got[owners[7]]) == got[owners[7]]


def test_a_lease_is_given_back_by_release_or_when_its_sandbox_is_gone(
    scratch: Path, leases: UidLeases
) -> None:
    first, second, third = _owners(scratch, 3)
    uid = leases.acquire(first)
    assert leases.acquire(second) != uid
    # Only the holder gives it back.
    leases.release(second, uid)
    assert leases.holder(uid) == first
    leases.release(first, uid)
    assert leases.holder(uid) is None
    assert leases.acquire(third) == uid
    # A lease whose sandbox directory is gone (removed by hand) is stale: taken back.
    shutil.rmtree(third)
    fourth = scratch / "sandbox-4"
    fourth.mkdir()
    assert leases.acquire(fourth) == uid


def test_a_uid_with_a_live_process_is_never_handed_out(scratch: Path, leases: UidLeases) -> None:
    (owner,) = _owners(scratch, 1)
    free = next(u for u in range(FIRST_UID, FIRST_UID + 1000) if u not in uids_with_processes())
    # A process of that uid with no lease (a lost one, or something else using the range).
    squatter = subprocess.Popen(["sleep", "60"], user=free, group=free, extra_groups=[])
    try:
        wait_until(lambda: free in uids_with_processes(), timeout=10)
        assert leases.acquire(owner, prefer=free) != free
    finally:
        squatter.kill()
        squatter.wait()


def test_a_lease_directory_others_can_write_is_refused(scratch: Path) -> None:
    directory = scratch / "open"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    (owner,) = _owners(scratch, 1)
    with pytest.raises(SandboxError, match="only this worker's user can write"):
        UidLeases(directory).acquire(owner)


def test_a_sandbox_that_lost_its_lease_gets_a_new_uid_and_keeps_its_files(
    scratch: Path, leases: UidLeases
) -> None:
    host = SandboxHost(scratch / "root", uid_leases=leases)
    first = host.create(uuid.uuid4().hex, run_id="test", backend="bwrap")
    host.put_file(first, "notes.txt", b"kept\n")
    assert first.uid is not None
    old = first.uid
    # The lease directory was emptied (it is under /run: a reboot) and the uid went to another.
    (leases.directory / str(old)).unlink()
    (other,) = _owners(scratch, 1)
    assert leases.acquire(other, prefer=old) == old
    append = ["sh", "-c", "echo more >> notes.txt && id -u && cat notes.txt"]
    result = asyncio.run(host.exec(host.get(first.id), append, Limits(time_s=20)))
    again = host.get(first.id)
    assert again.uid not in (None, old)
    assert (result.exit_code, result.stdout) == (0, f"{again.uid}\nkept\nmore\n"), result
    assert (first.work / "notes.txt").stat().st_uid == again.uid
    assert leases.holder(old) == other


def test_a_sandbox_made_before_uids_were_leased_gets_one_at_its_next_command(
    scratch: Path, leases: UidLeases
) -> None:
    host = SandboxHost(scratch / "root", uid_leases=leases)
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend="bwrap")
    assert sandbox.uid is not None
    (sandbox.work / "sub").mkdir()
    (sandbox.work / "sub" / "data.txt").write_text("old\n")
    # As an earlier version left it: no uid in sandbox.json, /work its hashed uid's, no lease.
    meta_path = sandbox.path / "sandbox.json"
    meta = json.loads(meta_path.read_text())
    del meta["uid"]
    meta_path.write_text(json.dumps(meta))
    leases.release(sandbox.path, sandbox.uid)
    hashed = FIRST_UID + 59_999
    for path in (sandbox.work, sandbox.work / "sub", sandbox.work / "sub" / "data.txt"):
        os.chown(path, hashed, hashed)
    legacy = host.get(sandbox.id)
    assert legacy.uid is None
    result = asyncio.run(
        host.exec(legacy, ["sh", "-c", "echo new >> sub/data.txt && cat sub/data.txt"], Limits())
    )
    assert (result.exit_code, result.stdout) == (0, "old\nnew\n"), result
    leased = host.get(sandbox.id).uid
    assert leased is not None
    assert leases.holder(leased) == sandbox.path
    assert asyncio.run(host.destroy(sandbox.id))
    assert leases.holder(leased) is None


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
def test_a_sandbox_whose_skeleton_has_an_empty_dev_still_runs(
    scratch: Path, leases: UidLeases, backend: str
) -> None:
    host = SandboxHost(scratch / "root", uid_leases=leases)
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend=backend)
    # As an earlier version made it: nothing in the skeleton's /dev.
    dev = sandbox.path / "rootfs" / "dev"
    for entry in dev.iterdir():
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    # Python, not ls: this gVisor's statx fails for coreutils' ls whatever the directory.
    probe = "import os; open('/dev/null', 'w').write('x'); print(*sorted(os.listdir('/dev')))"
    result = asyncio.run(host.exec(sandbox, ["python3", "-I", "-c", probe], Limits()))
    assert (result.exit_code, result.stdout.split()) == (
        0,
        ["fd", "null", "pts", "random", "stderr", "stdin", "stdout", "urandom", "zero"],
    ), result


def test_the_lease_directory_can_be_named_in_the_environment(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERLOOP_SANDBOX_UID_LEASES", str(scratch / "shared"))
    (owner,) = _owners(scratch, 1)
    uid = UidLeases().acquire(owner)
    assert (scratch / "shared" / str(uid)).read_text() == str(owner)
    assert SandboxHost(scratch / "root").uids.directory == scratch / "shared"
