"""What the guest of a sandbox can and cannot do, with the real backends (bwrap and gVisor).

Most cases run under bubblewrap (about 20 ms a command); the ones that matter most for
isolation run under gVisor too (about 0.4 s a command).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerloop.sandbox import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxHost,
    SandboxUnavailable,
    require_backend,
)
from ledgerloop.sandbox.backends import processes_of_uid
from ledgerloop.testing.postgres import wait_until
from tests.support.sandbox_checks import gvisor_containers, processes_naming

BOTH = ["bwrap", "gvisor"]


@pytest.fixture
def host() -> Iterator[SandboxHost]:
    # Not under pytest's tmp_path: a sandbox's own uid must be able to reach its directory.
    root = Path(tempfile.mkdtemp(prefix="ll-sandbox-test-"))
    root.chmod(0o711)
    yield SandboxHost(root)
    for sandbox_id in SandboxHost(root).ids():
        asyncio.run(SandboxHost(root).destroy(sandbox_id))
    shutil.rmtree(root, ignore_errors=True)


def run(
    host: SandboxHost, backend: str, code: str, limits: Limits | None = None
) -> tuple[Sandbox, ExecResult]:
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend=backend)
    host.put_file(sandbox, "main.py", code.encode())
    argv = ["python3", "-I", "main.py"]
    return sandbox, asyncio.run(host.exec(sandbox, argv, limits or Limits(time_s=20)))


@pytest.fixture
def loopback_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on the host's 127.0.0.1 that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            accepted.append(client.recv(100))
            client.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept() the thread is blocked in
    server.close()
    thread.join(5)


@pytest.mark.parametrize("backend", BOTH)
def test_guest_cannot_reach_a_server_on_the_hosts_loopback(
    host: SandboxHost, backend: str, loopback_server: tuple[int, list[bytes]]
) -> None:
    port, accepted = loopback_server
    # The server answers from the host itself: the failure inside is the sandbox's doing.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as probe:
        probe.sendall(b"host")
    code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"guest")
    print("CONNECTED")
except OSError as exc:
    print("refused", type(exc).__name__)
"""
    _, result = run(host, backend, code)
    assert "refused" in result.stdout, result
    assert "CONNECTED" not in result.stdout
    assert b"guest" not in accepted


@pytest.mark.parametrize("backend", BOTH)
def test_a_secret_in_the_workers_environment_is_not_readable_inside(
    host: SandboxHost, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("LEDGERLOOP_TEST_SECRET", secret)
    code = """
import os, pathlib
print(sorted(os.environ))
print(os.environ.get("LEDGERLOOP_TEST_SECRET"))
for proc in pathlib.Path("/proc").iterdir():
    try:
        print(proc.name, (proc / "environ").read_bytes())
    except OSError:
        pass
"""
    _, result = run(host, backend, code)
    assert result.exit_code == 0, result
    assert secret not in result.stdout + result.stderr
    assert "LEDGERLOOP_TEST_SECRET" not in result.stdout


@pytest.mark.parametrize("backend", BOTH)
def test_writing_outside_the_working_directory_fails(host: SandboxHost, backend: str) -> None:
    outside = host.root / f"escaped-{uuid.uuid4().hex}"
    code = f"""
import sys
failures = 0
for path in ["/etc/owned", "/usr/owned", "/tmp/owned", "/owned", "../owned", {str(outside)!r}]:
    try:
        open(path, "w").write("x")
        print("WROTE", path)
    except OSError as exc:
        failures += 1
        print("refused", path, type(exc).__name__)
open("inside.txt", "w").write("fine")
sys.exit(0 if failures == 6 else 1)
"""
    sandbox, result = run(host, backend, code)
    assert result.exit_code == 0, result
    assert "WROTE" not in result.stdout
    assert not outside.exists()
    assert (sandbox.work / "inside.txt").read_text() == "fine"


@pytest.mark.parametrize("backend", BOTH)
def test_a_fork_bomb_is_stopped_by_the_process_limit(host: SandboxHost, backend: str) -> None:
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend=backend)
    limits = Limits(time_s=10, processes=16)
    # Count how many processes the guest can have at once, then detonate a classic bomb.
    counter = """
import os, time
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError:
    pass
print("children", children, flush=True)
os._exit(0)
"""
    host.put_file(sandbox, "count.py", counter.encode())
    counted = asyncio.run(host.exec(sandbox, ["python3", "-I", "count.py"], limits))
    children = int(counted.stdout.split()[-1])
    assert 0 < children < limits.processes, counted
    bomb = asyncio.run(host.exec(sandbox, ["sh", "-c", "f(){ f|f& };f; sleep 2"], limits))
    assert not bomb.timed_out or bomb.exit_code != 0
    assert host.running() == []
    if backend == "bwrap":
        assert sandbox.uid is not None
        uid = sandbox.uid
        wait_until(lambda: processes_of_uid(uid) == [], timeout=5)


@pytest.mark.parametrize("backend", BOTH)
def test_an_infinite_loop_is_stopped_by_the_time_limit(host: SandboxHost, backend: str) -> None:
    sandbox, result = run(host, backend, "while True:\n    pass\n", Limits(time_s=1))
    assert result.timed_out
    assert result.exit_code != 0
    # Stopped at the limit, not when the CPU-seconds rlimit (2 s) or anything later caught it;
    # the margin is for a slow gVisor start and kill on a busy machine.
    assert 1 <= result.duration_s < 8, result
    assert host.running() == []
    # Nothing of the command survives its kill: no container, no process of its own.
    assert gvisor_containers(host) == []
    assert processes_naming(host.root) == []
    if backend == "bwrap":
        assert sandbox.uid is not None
        uid = sandbox.uid
        wait_until(lambda: processes_of_uid(uid) == [], timeout=5)
    # The sandbox outlives its command: the next one runs in the same directory.
    host.put_file(sandbox, "after.py", b"print('still here')")
    after = asyncio.run(host.exec(sandbox, ["python3", "-I", "after.py"], Limits(time_s=20)))
    assert (after.exit_code, after.stdout) == (0, "still here\n")


def test_memory_and_output_limits(host: SandboxHost) -> None:
    _, hog = run(
        host, "bwrap", "x = bytearray(1 << 30)\nprint('allocated')\n", Limits(memory_mb=128)
    )
    assert hog.exit_code != 0
    assert "MemoryError" in hog.stderr
    _, chatty = run(host, "bwrap", "print('y' * 3_000_000)\n", Limits(output_bytes=1000))
    assert chatty.truncated
    assert len(chatty.stdout) == 1000
    assert chatty.output_bytes == 3_000_001


def test_files_the_guest_links_outside_are_never_read_or_written_through(
    host: SandboxHost,
) -> None:
    secret = host.root / "host-secret.txt"
    secret.write_text("host only")
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend="bwrap")
    # The guest cannot see the host file, but it can plant a link naming its host path.
    code = "".join(f"os.symlink({str(secret)!r}, {name!r})\n" for name in ("out.txt", "main2.py"))
    code = "import os\n" + code
    host.put_file(sandbox, "main.py", code.encode())
    asyncio.run(host.exec(sandbox, ["python3", "-I", "main.py"], Limits()))
    assert host.collect(sandbox, ["*.txt"], 1000) == {}
    host.put_file(sandbox, "main2.py", b"print('replaced')")
    assert secret.read_text() == "host only"
    with pytest.raises(SandboxError, match="plain file name"):
        host.put_file(sandbox, "../escape.py", b"x")


def test_snapshot_and_restore_keep_the_working_directory(host: SandboxHost) -> None:
    sandbox, _ = run(host, "bwrap", "open('state.txt', 'w').write('kept')\n")
    data = host.snapshot(sandbox, 1 << 20)
    assert asyncio.run(host.destroy(sandbox.id))
    assert host.ids() == []
    again = host.create(sandbox.id, run_id="test", backend="bwrap", snapshot=data)
    result = asyncio.run(host.exec(again, ["cat", "state.txt"], Limits()))
    assert result.stdout == "kept"


def test_a_missing_backend_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable) as caught:
        require_backend("gvisor")
    message = caught.value.one_line()
    assert "runsc" in message
    assert "scripts/install-sandbox" in message
    with pytest.raises(SandboxUnavailable, match="unknown sandbox backend"):
        require_backend("firecracker")


@pytest.mark.parametrize("backend", BOTH)
def test_output_printed_before_a_timeout_is_kept(host: SandboxHost, backend: str) -> None:
    code = """
import sys
print("before the loop", flush=True)
print("on stderr", file=sys.stderr, flush=True)
while True:
    pass
"""
    _, result = run(host, backend, code, Limits(time_s=1))
    assert result.timed_out, result
    assert (result.stdout, result.stderr) == ("before the loop\n", "on stderr\n"), result
    assert (result.output_bytes, result.truncated) == (26, False)
    # Past the output limit before the timeout: the limit's worth is kept, the rest counted.
    chatty = "print('y' * 5000, flush=True)\nwhile True:\n    pass\n"
    _, result = run(host, backend, chatty, Limits(time_s=1, output_bytes=1000))
    assert result.timed_out, result
    assert (result.stdout, result.stderr) == ("y" * 1000, ""), result
    assert (result.output_bytes, result.truncated) == (5001, True)


DEV_PROBE = """
import json, os
seen = {"dev": sorted(os.listdir("/dev")), "pts": sorted(os.listdir("/dev/pts")), "wrote": []}
for path in ["/dev/owned", "/dev/shm/owned", "/dev/pts/owned", "/dev/fd/../owned"]:
    try:
        open(path, "w").write("x")
        seen["wrote"].append(path)
    except OSError:
        pass
for directory in ["/dev/shm", "/dev/new"]:
    try:
        os.mkdir(directory)
        seen["wrote"].append(directory)
    except OSError:
        pass
try:
    from multiprocessing import shared_memory
    block = shared_memory.SharedMemory(create=True, size=320 * 1024 * 1024)
    block.buf[:] = b"x" * block.size  # memory no limit would have counted
    seen["wrote"].append("shared memory")
except OSError:
    pass
try:
    os.openpty()
    seen["wrote"].append("a pty")
except OSError:
    pass
open("/dev/null", "w").write("discarded")
seen["null"] = open("/dev/null", "rb").read()
seen["zero"] = open("/dev/zero", "rb").read(4).hex()
seen["urandom"] = len(open("/dev/urandom", "rb").read(16))
seen["random"] = len(open("/dev/random", "rb").read(16))
print(json.dumps(seen, default=repr))
"""


@pytest.mark.parametrize("backend", BOTH)
def test_dev_is_read_only_with_only_the_devices_a_program_needs(
    host: SandboxHost, backend: str
) -> None:
    _, result = run(host, backend, DEV_PROBE, Limits(time_s=20, memory_mb=256))
    assert result.exit_code == 0, result
    seen = json.loads(result.stdout)
    # No tty, no ptmx or pts, no full, no shm: the devices a program reads and writes, and
    # the links shells use for redirections and process substitution.
    assert seen["dev"] == sorted(
        ["fd", "null", "pts", "random", "stderr", "stdin", "stdout", "urandom", "zero"]
    ), seen
    assert seen["pts"] == []
    assert seen["wrote"] == [], seen
    assert (seen["null"], seen["zero"], seen["urandom"], seen["random"]) == (
        "b''",
        "00000000",
        16,
        16,
    )


def test_two_live_sandboxes_never_share_a_uid_and_one_ending_leaves_the_other_running(
    host: SandboxHost,
) -> None:
    # Ids alike in their last eight characters, which a uid hashed from the id would share.
    tail = uuid.uuid4().hex[:8]
    first = host.create("a" * 24 + tail, run_id="test", backend="bwrap")
    second = host.create("b" * 24 + tail, run_id="test", backend="bwrap")
    assert first.uid is not None
    assert second.uid is not None
    first_uid = first.uid
    assert first_uid != second.uid
    assert host.uids.holder(first_uid) == first.path
    # The first runs until the test lets it finish; the second starts and ends meanwhile.
    waiter = """
import os, time
open("started", "w").close()
while not os.path.exists("finish"):
    time.sleep(0.01)
print("finished in time")
"""
    host.put_file(first, "wait.py", waiter.encode())

    async def both() -> tuple[ExecResult, ExecResult]:
        waiting = asyncio.ensure_future(
            host.exec(first, ["python3", "-I", "wait.py"], Limits(time_s=60))
        )
        deadline = asyncio.get_running_loop().time() + 30
        while not (first.work / "started").exists():
            assert not waiting.done(), waiting.result()
            assert asyncio.get_running_loop().time() < deadline, "the first never started"
            await asyncio.sleep(0.01)
        ended = await host.exec(second, ["sh", "-c", "echo ended"], Limits(time_s=20))
        # The first is still alive after the second's end, and still runs as its own uid.
        assert processes_of_uid(first_uid), "the second's end killed the first"
        host.put_file(first, "finish", b"")
        return await waiting, ended

    waited, ended = asyncio.run(both())
    assert (ended.exit_code, ended.stdout) == (0, "ended\n")
    assert (waited.exit_code, waited.stdout, waited.timed_out) == (0, "finished in time\n", False)
    # Destroying a sandbox gives its uid back.
    assert asyncio.run(host.destroy(first.id))
    assert host.uids.holder(first_uid) is None
    assert host.uids.holder(second.uid) == second.path


def test_the_end_of_one_command_leaves_another_of_its_sandbox_running(
    host: SandboxHost,
) -> None:
    sandbox = host.create(uuid.uuid4().hex, run_id="test", backend="bwrap")
    waiter = """
import os, time
open("started", "w").close()
while not os.path.exists("finish"):
    time.sleep(0.01)
print("finished in time")
"""
    host.put_file(sandbox, "wait.py", waiter.encode())

    async def both() -> tuple[ExecResult, ExecResult]:
        waiting = asyncio.ensure_future(
            host.exec(sandbox, ["python3", "-I", "wait.py"], Limits(time_s=60))
        )
        deadline = asyncio.get_running_loop().time() + 30
        while not (sandbox.work / "started").exists():
            assert not waiting.done(), waiting.result()
            assert asyncio.get_running_loop().time() < deadline, "the waiter never started"
            await asyncio.sleep(0.01)
        # Same sandbox, same uid: this one ends (by the time limit, killed) while the other runs.
        looping = "while True:\n    pass\n"
        host.put_file(sandbox, "loop.py", looping.encode())
        ended = await host.exec(sandbox, ["python3", "-I", "loop.py"], Limits(time_s=1))
        host.put_file(sandbox, "finish", b"")
        return await waiting, ended

    waited, ended = asyncio.run(both())
    assert ended.timed_out, ended
    assert (waited.exit_code, waited.stdout, waited.timed_out) == (0, "finished in time\n", False)
