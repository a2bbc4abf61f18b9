"""A module whose schedule is wrong in the way LEDGERLOOP_TEST_BAD_SCHEDULE names, for the
tests of a worker that refuses to start."""

from __future__ import annotations

import os

from ledgerloop import Schedule, register_schedule

_WRONG = {
    "agent": {"cron": "0 2 * * *", "agent": "ghost"},
    "cron": {"cron": "0 2 * *", "agent": "ops"},
    "zone": {"cron": "0 2 * * *", "agent": "ops", "timezone": "Europe/Atlantis"},
}

register_schedule(Schedule("nightly", **_WRONG[os.environ["LEDGERLOOP_TEST_BAD_SCHEDULE"]]))  # type: ignore[arg-type]
