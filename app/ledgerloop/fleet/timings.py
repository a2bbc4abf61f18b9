"""The fleet's timings and what a heartbeat reports: how often a worker heartbeats, when a
silent one counts as dead, and the records of takeovers and rewind checks
(ledgerloop.fleet.heartbeat)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

#: Namespace of the advisory locks heartbeat sessions hold ("LLFW"); the key is per worker.
LOCK_NAMESPACE = 0x4C4C_4657

#: How long past a worker's lease its peers wait before taking it over once its session is
#: gone (see FleetTimings).
SESSION_MARGIN_S = 0.1

#: An early tick for a peer whose session is gone comes this long after its lease ran out.
DUE_MARGIN_S = 0.02

#: How long this worker remembers the last checkpoint of a workflow it executed. A failover
#: loses only the replication lag of that moment (failover managers refuse to promote a
#: replica lagging past a bound): anything older is on the new primary, so memory past any lag
#: a failover may lose is never consulted. 10 minutes is far past such bounds, at one small
#: entry per workflow checkpointed meanwhile (docs/operations.md, Failover).
REMEMBER_S = 600.0

#: A workflow claimed this recently may not be known to the fence yet (its execution is
#: handed to the event loop after the claim commits: milliseconds, about a second on a
#: 2-core machine loaded three times over): not judged idle, but judged again by a second
#: check once this has passed. A late execution judged idle stops at its first ownership check
#: and its run is claimed afresh; nothing is lost either way.
CLAIM_GRACE_MS = 2000

#: How often a worker publishes the workflows it executes (`ledgerloop runs stuck`).
PUBLISH_EVERY_S = 2.0

#: A resting worker with no heartbeating peer looks at its peers this often, as a share of
#: FleetTimings.gap_s: so its streak never breaks (executor_heartbeat) and it judges a peer
#: that starts heartbeating and dies at once as promptly as a heartbeating worker would. It
#: watches every heartbeat while any peer heartbeats.
REST_WATCH_SHARE = 0.8

#: The channel a worker notifies when it starts heartbeating (registered, or woken from a
#: rest): resting peers then watch it while it may hold runs.
FLEET_CHANNEL = "ledgerloop_fleet"

#: The workflows whose executions the fence knows (agent.loop, agent.episodes).
FENCED_WORKFLOWS = ("ledgerloop_run", "ledgerloop_episode")


@dataclass(frozen=True)
class Rewind:
    """What the rewind check found after a reconnection."""

    #: Workflows whose last checkpoint by this worker the database no longer holds.
    lost: list[str]
    #: Workflows put back on the queue (lost, or PENDING here and not executed here).
    moved: list[str]
    #: The server's timeline before and after (None: unknown).
    timeline_before: int | None
    timeline_after: int | None


def software_version() -> str:
    try:
        return package_version("ledgerloop")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class FleetTimings:
    """How often a worker heartbeats and when a silent one counts as dead.

    lease_s: how long after sending a heartbeat an idle worker may start step bodies.
    busy_heartbeat_s, busy_lease_s: the same while the worker executes runs. It heartbeats
    twice as often and takes a shorter lease, so that when it dies its runs wait less for a
    peer; an idle worker has nothing to hand over and keeps the database's load low.
    Each heartbeat writes the lease it grants into the worker's row (`lease_until`, never
    moved earlier), and peers judge by that row, whatever timings they run with.
    session_dead_s: a worker whose heartbeat session is gone counts as dead this long after
    an idle worker's heartbeat (its row's lease plus the margin, for a row written before
    rows carried their lease). The lease counts from before the heartbeat's statement was
    sent, its row holds the database's time when it ran, so the margin only has to cover how
    far two clocks' rates can differ over a lease (parts per million) and the step from the
    fence's check to the body's start.
    gap_s: a heartbeat later than this after the previous one starts a new streak.
    """

    heartbeat_s: float = 0.5
    stale_after_s: float = 5.0

    @property
    def lease_s(self) -> float:
        return max(self.heartbeat_s * 2.5, self.stale_after_s / 4)

    @property
    def busy_heartbeat_s(self) -> float:
        return self.heartbeat_s / 2

    @property
    def busy_lease_s(self) -> float:
        # Two busy heartbeats may be late before steps pause (never a wrong takeover).
        return self.busy_heartbeat_s * 3

    @property
    def session_dead_s(self) -> float:
        return self.lease_s + SESSION_MARGIN_S

    @property
    def gap_s(self) -> float:
        return self.stale_after_s / 2

    def params(self) -> dict[str, Any]:
        return {
            "stale_s": self.stale_after_s,
            "lease_s": self.lease_s,
            "margin_s": SESSION_MARGIN_S,
            "gap_s": self.gap_s,
            "lock_ns": LOCK_NAMESPACE,
        }


@dataclass(frozen=True)
class Takeover:
    """A dead peer this worker took over, and how many of its runs went back on the queue."""

    executor_id: str
    hostname: str
    silent_s: float
    runs: int
