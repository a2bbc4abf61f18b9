"""A long-running command that has stopped ends its process, even if threads linger.

DBOS retries a system-database statement with backoff and no deadline, on its own
threads. A worker that stops during a database outage (SIGTERM from its supervisor, or a
service that failed) would leave those threads retrying, and Python waits for every
non-daemon thread before it exits: the process would linger, its supervisor would never
restart it, and no other worker would take its runs until the database returned. A run
those threads were recording is safe to abandon: the worker's row stays, and whoever
takes its runs over replays them from the journal, as after a crash.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import click
import typer

#: How long a stopped command's lingering threads get before the process ends anyway.
GRACE_S = 5.0


def _exit_code(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    # typer's own Exit is not click's since typer vendors click.
    if isinstance(exc, (click.exceptions.Exit, typer.Exit)):
        return int(exc.exit_code)
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return 1


def _end_after(grace_s: float, code: int) -> None:
    def end() -> None:
        # Daemon: if every other thread ends first, the interpreter exits normally and
        # this thread simply never wakes.
        threading.Event().wait(grace_s)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)

    threading.Thread(target=end, name="ledgerloop-exit", daemon=True).start()


@contextmanager
def process_ends_after() -> Iterator[None]:
    """Around the `ledgerloop` executable's command: once it returns or raises, the process
    ends within GRACE_S with the status the command chose. Only the executable arms this
    (`ledgerloop.cli.main`): a program that runs `cli` in-process keeps its own process."""
    raised: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        raised = exc
        raise
    finally:
        _end_after(GRACE_S, _exit_code(raised))
