"""Named fault points for crash tests.

`hit("relay.before_send")` kills this process with SIGKILL, but only when a test named that
point in LEDGERLOOP_FAULTS (comma separated) for this process. A name ending in `*` arms every
point that starts with it (`step.after:tool-0-*`). When no fault is enabled the check is one
frozenset lookup, so fault points may sit on hot paths.

Besides the points named in the code, every step of the agent loop is a boundary:
`step.after:{step name}` fires right after the step's result is recorded.
"""

from __future__ import annotations

import os
import signal

_ENABLED = frozenset(
    name.strip() for name in os.environ.get("LEDGERLOOP_FAULTS", "").split(",") if name.strip()
)
_PREFIXES = tuple(name[:-1] for name in _ENABLED if name.endswith("*"))


def hit(name: str) -> None:
    if name in _ENABLED or (_PREFIXES and name.startswith(_PREFIXES)):
        # Flush nothing, release nothing: exactly what a power cut or OOM kill leaves behind.
        os.kill(os.getpid(), signal.SIGKILL)


def after_step(step: str) -> None:
    """The boundary right after `step` was recorded (`step.after:{step}`)."""
    if _ENABLED:
        hit(f"step.after:{step}")
