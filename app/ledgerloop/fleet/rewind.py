"""The rewind check: after a reconnection, is what this worker recorded still there?

After a failover to a replica that lagged, the commits the old primary had not shipped are
gone. The check (queries.sql `executor_rewound`) compares the last checkpoint of each
workflow this worker executed lately, and the effects it recorded, with the journal the
database now holds; what is missing, and what is PENDING under this worker without being
executed here, goes back on the queue, and the fence is revoked so every execution here
checks its ownership before its next step (fleet/heartbeat.py runs it).
"""

from __future__ import annotations

import logging

from ledgerloop.db import dbos_checkpoint
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.timings import CLAIM_GRACE_MS, FENCED_WORKFLOWS, REMEMBER_S, Rewind

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.fleet")


def follow_rewind(
    conn: Conn, executor_id: str, fence: Fence, before: int | None, after: int | None
) -> Rewind:
    """Run the check on `conn` for `executor_id` (the server's timeline went from `before`
    to `after`) and follow what it found: the fence revoked, lost checkpoints forgotten."""
    held = dbos_checkpoint.written(REMEMBER_S)
    effects = dbos_checkpoint.effects_written(REMEMBER_S)
    row = conn.execute(
        Q["executor_rewound"],
        {
            "id": executor_id,
            "workflow_ids": list(held),
            "function_ids": list(held.values()),
            "effect_keys": list(effects),
            "effect_workflows": list(effects.values()),
            "running": list(fence.running),
            "names": list(FENCED_WORKFLOWS),
            "grace_ms": CLAIM_GRACE_MS,
            "timeline": after,
        },
    ).fetchone()
    lost = list(row["lost"]) if row else []
    moved = list(row["moved"]) if row else []
    changed = before is not None and after is not None and before != after
    if lost or moved or changed:
        # Every execution here checks its ownership before its next step: those put back,
        # and those whose claim the database lost, stop there.
        back = set(lost) | set(moved)
        fence.stale.update(o for w, o in list(fence.owners.items()) if w in back)
        fence.revoke()
        dbos_checkpoint.forget(lost)
    if lost:
        executing = sum(1 for w in set(lost) | set(moved) if w in fence.running)
        log.warning(
            "the database went back in time (timeline %s -> %s): %d workflows lost their last "
            "recorded step; %d went back on the queue (%d executing here stop at their next "
            "step) to resume from the journal the database holds",
            before,
            after,
            len(lost),
            len(moved),
            executing,
        )
    elif moved:
        log.warning(
            "%d workflows were PENDING under this worker, which no longer executes them (their "
            "end was lost?); they went back on the queue",
            len(moved),
        )
    elif changed:
        log.info("the server's timeline moved %s -> %s; nothing recorded was lost", before, after)
    return Rewind(lost, moved, before, after)
