"""Worker processes for crash tests: real `ledgerloop up` subprocesses, killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def worker_env(database_url: str, **extra: str) -> dict[str, str]:
    """A clean environment for a worker on `database_url` (nothing inherited from LEDGERLOOP_),
    running the example agent under the shipped policy unless `extra` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env.update(
        {
            "LEDGERLOOP_DATABASE_URL": database_url,
            "LEDGERLOOP_POLICY_FILE": str(REPO / "tool_policy.yaml"),
            "LEDGERLOOP_AGENT_MODULES": "ledgerloop.examples.ops_agent",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra)
    return env


def start_relay(env: Mapping[str, str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """`ledgerloop relay`: the relay and the reconciler alone, so a test can kill them alone."""
    return _spawn(env, ["relay"], log)


def start_worker(
    env: Mapping[str, str], *args: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """`ledgerloop up --no-http`: a worker process."""
    return _spawn(env, ["up", "--no-http", *args], log)


#: A process on standby: it imports what a worker and a relay need (most of a start-up's
#: time on a busy machine), then waits for a line on stdin before it reads its settings,
#: connects to anything or launches DBOS.
_STANDBY = """
import sys
import ledgerloop.cli, ledgerloop.services, ledgerloop.worker
import ledgerloop.effects.reconciler, ledgerloop.effects.relay
if sys.stdin.readline():
    ledgerloop.cli.main()
"""


def standby_worker(
    env: Mapping[str, str], *args: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """`start_worker`, held after its imports until `release(proc)`: a test starts the
    process that takes over after a crash while the first one runs, so its imports overlap
    the first one's work (it starts from nothing all the same: a new interpreter, executor
    id and DBOS launch)."""
    return _spawn(env, ["up", "--no-http", *args], log, hold=True)


def standby_relay(env: Mapping[str, str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """`start_relay`, held after its imports until `release(proc)`."""
    return _spawn(env, ["relay"], log, hold=True)


def release(proc: subprocess.Popen[bytes]) -> None:
    """Let a standby process start."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()


def _spawn(
    env: Mapping[str, str], args: list[str], log: Path | None, *, hold: bool = False
) -> subprocess.Popen[bytes]:
    out = log.open("ab") if log else None
    command = ["-c", _STANDBY] if hold else ["-m", "ledgerloop.cli"]
    try:
        return subprocess.Popen(
            [sys.executable, *command, *args],
            env=dict(env),
            cwd=REPO,
            stdin=subprocess.PIPE if hold else None,
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
        )
    finally:
        if out:
            out.close()  # the child has its own copy of the descriptor


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    stop_all(proc, timeout=timeout)


def stop_all(*procs: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    """SIGTERM every process first, then wait: their clean stops overlap."""
    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()  # a standby never released: it ends at its readline
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def worker_process(
    env: Mapping[str, str], *args: str, log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_worker(env, *args, log=log)
    try:
        yield proc
    finally:
        stop_worker(proc)
