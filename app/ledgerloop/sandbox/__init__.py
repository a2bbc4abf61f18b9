"""Isolated execution of model-written code: gVisor (`runsc`) or bubblewrap (`bwrap`).

`host` keeps sandboxes on disk (a working directory per sandbox, one short-lived container per
command), `backends` builds each backend's command line, `reaper` destroys what a killed
worker left behind. The agent loop drives them as journaled steps (ledgerloop.agent.act_sandbox).
"""

from ledgerloop.sandbox.backends import BACKENDS, Backend, require_backend
from ledgerloop.sandbox.errors import SandboxError, SandboxGone, SandboxUnavailable
from ledgerloop.sandbox.host import ExecResult, Limits, Sandbox, SandboxHost

__all__ = [
    "BACKENDS",
    "Backend",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxHost",
    "SandboxUnavailable",
    "require_backend",
]
