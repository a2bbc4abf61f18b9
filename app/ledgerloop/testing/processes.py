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
    """A clean environment for a worker on `database_url` (nothing inherited from LEDGERLOOP_)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env.update(
        {
            "LEDGERLOOP_DATABASE_URL": database_url,
            "LEDGERLOOP_POLICY_FILE": str(REPO / "tool_policy.yaml"),
            "LEDGERLOOP_QUEUE_POLL_S": "0.02",
            "PYTHONPATH": os.pathsep.join([str(REPO / "app"), str(REPO)]),
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


def _spawn(env: Mapping[str, str], args: list[str], log: Path | None) -> subprocess.Popen[bytes]:
    out = log.open("ab") if log else None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", *args],
            env=dict(env),
            cwd=REPO,
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
        )
    finally:
        if out:
            out.close()  # the child has its own copy of the descriptor


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
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
