"""Named fault points for crash tests.

`hit("after_external_commit")` kills this process with SIGKILL, but only when a test named
that point in LEDGERLOOP_FAULTS (comma separated) for this process. When no fault is enabled
the check is one frozenset lookup, so fault points may sit on hot paths.
"""

from __future__ import annotations

import os
import signal

_ENABLED = frozenset(
    name.strip() for name in os.environ.get("LEDGERLOOP_FAULTS", "").split(",") if name.strip()
)


def hit(name: str) -> None:
    if name in _ENABLED:
        # Flush nothing, release nothing: exactly what a power cut or OOM kill leaves behind.
        os.kill(os.getpid(), signal.SIGKILL)
