"""How many database connections a process may hold, and how they are split.

`LEDGERLOOP_MAX_CONNECTIONS` caps every connection of one process. Some parts hold exactly
one connection each (the fixed ones); the pools share the rest. With the default cap of 15,
three `ledgerloop up` processes and an application fit a default Postgres (max_connections
100, 3 of them reserved for superusers).

The fixed connections:

- heartbeat: the worker's session, whose advisory lock tells peers it is alive;
- listener: the one LISTEN connection of the process; the dispatcher claims queued runs on
  it, and it hears DBOS's channels (forwarded to DBOS's waiters), the outbox's (the relay)
  and the run streams' (the HTTP server's event streams);
- relay claim, relay record: the relay's two sessions (claims, and the recorder's batches);
- reconciler: its one session;
- spare: short-lived connections (a start-up check, the dispatcher's wake-up on stop).

The shared rest goes to DBOS's pool (workflow status, messages, waits), Ledgerloop's pool
(step bodies, the HTTP API, DBOS's journal checks and checkpoints) and, in a worker that runs
the relay, the pool act steps record their effects on. Each has a minimum below which the
process does not start: a cap under the sum of the fixed connections and these minimums is
refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ledgerloop.errors import ConfigError

Process = Literal["up", "relay", "http"]

#: One connection each.
HEARTBEAT, LISTENER, RELAY_CLAIM, RELAY_RECORD, RECONCILER, SPARE = (
    "heartbeat",
    "listener",
    "relay claim",
    "relay record",
    "reconciler",
    "spare",
)

#: The shared pools, their least size, and their weight in the split of the rest.
DBOS_POOL, LEDGERLOOP_POOL, RELAY_STEPS, HTTP_POOL = "dbos", "pool", "relay steps", "http"
_MINIMUM = {DBOS_POOL: 2, LEDGERLOOP_POOL: 2, RELAY_STEPS: 1, HTTP_POOL: 1}
_WEIGHT = {DBOS_POOL: 3, LEDGERLOOP_POOL: 4, RELAY_STEPS: 2, HTTP_POOL: 4}

#: What `LEDGERLOOP_MAX_CONNECTIONS` defaults to.
DEFAULT_CAP = 15


@dataclass(frozen=True)
class Footprint:
    """The connections one process may hold: `fixed` parts of one connection each, and
    `pools` sizes; together never more than `cap`."""

    process: str
    cap: int
    fixed: tuple[str, ...]
    pools: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.fixed) + sum(self.pools.values())

    def pool(self, name: str) -> int:
        return self.pools.get(name, 0)

    def describe(self) -> str:
        parts = [f"{name} 1" for name in self.fixed]
        parts += [f"{name} pool {size}" for name, size in self.pools.items()]
        return f"{self.total} of {self.cap}: " + ", ".join(parts)


def _parts(process: Process, *, relay: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fixed parts and the shared pools of a process."""
    if process == "relay":
        return (LISTENER, RELAY_CLAIM, RELAY_RECORD, RECONCILER, SPARE), ()
    if process == "http":
        return (LISTENER, SPARE), (DBOS_POOL, HTTP_POOL)
    fixed: tuple[str, ...] = (HEARTBEAT, LISTENER)
    pools: tuple[str, ...] = (DBOS_POOL, LEDGERLOOP_POOL)
    if relay:
        fixed += (RELAY_CLAIM, RELAY_RECORD, RECONCILER)
        pools += (RELAY_STEPS,)
    return (*fixed, SPARE), pools


def minimum(process: Process = "up", *, relay: bool = True) -> int:
    """The fewest connections the process starts with."""
    fixed, pools = _parts(process, relay=relay)
    return len(fixed) + sum(_MINIMUM[name] for name in pools)


def plan(
    cap: int,
    process: Process = "up",
    *,
    relay: bool = True,
    dbos_pool_size: int | None = None,
    pool_size: int | None = None,
) -> Footprint:
    """Split `cap` connections between the parts of a process; refuse a cap below its
    minimum, or explicit pool sizes that do not fit under it, in one line."""
    fixed, pools = _parts(process, relay=relay)
    least = minimum(process, relay=relay)
    what = f"`ledgerloop {process}`" + (" --no-relay" if process == "up" and not relay else "")
    if cap < least:
        raise ConfigError(
            f"LEDGERLOOP_MAX_CONNECTIONS is {cap}, below the {least} connections {what} needs "
            f"({len(fixed)} fixed and the least of its pools)",
            fix=f"set LEDGERLOOP_MAX_CONNECTIONS to {least} or more",
        )
    explicit = {DBOS_POOL: dbos_pool_size, LEDGERLOOP_POOL: pool_size}
    if process == "http":
        # A standalone API reads steps through a DBOS client of two connections; its own
        # pool takes the rest.
        explicit = {DBOS_POOL: _MINIMUM[DBOS_POOL]}
    sizes: dict[str, int] = {}
    for name, size in explicit.items():
        if name in pools and size is not None:
            sizes[name] = size
    rest = cap - len(fixed)
    open_pools = [name for name in pools if name not in sizes]
    left = rest - sum(sizes.values()) - sum(_MINIMUM[name] for name in open_pools)
    if left < 0:
        given = " and ".join(
            f"LEDGERLOOP_{'DBOS_POOL_SIZE' if name == DBOS_POOL else 'POOL_SIZE'}={size}"
            for name, size in sizes.items()
        )
        raise ConfigError(
            f"{given} do not fit under LEDGERLOOP_MAX_CONNECTIONS={cap}: {what} keeps "
            f"{len(fixed)} fixed connections and needs "
            f"{sum(_MINIMUM[n] for n in open_pools)} for its other pools",
            fix=f"raise LEDGERLOOP_MAX_CONNECTIONS to {cap - left} or lower the pool sizes",
        )
    # The rest by weight, each open pool at least its minimum; rounding leftovers go to the
    # heaviest pools first.
    weight = sum(_WEIGHT[name] for name in open_pools)
    spread = rest - sum(sizes.values())
    for name in open_pools:
        sizes[name] = max(_MINIMUM[name], spread * _WEIGHT[name] // weight) if weight else 0
    over = sum(sizes.values()) - (rest)
    for name in sorted(open_pools, key=lambda n: _WEIGHT[n]):
        while over > 0 and sizes[name] > _MINIMUM[name]:
            sizes[name] -= 1
            over -= 1
    under = rest - sum(sizes.values())
    for name in sorted(open_pools, key=lambda n: -_WEIGHT[n]):
        if under > 0:
            sizes[name] += 1
            under -= 1
    return Footprint(
        process=process,
        cap=cap,
        fixed=fixed,
        pools={name: sizes[name] for name in pools},
    )


#: Postgres keeps application_name to 63 bytes (NAMEDATALEN - 1) and cuts the rest.
_NAME_MAX = 63

_executor: str | None = None


def name_executor(executor_id: str | None) -> None:
    """Name this process's connections `ledgerloop:<executor>:<part>` from now on (None: plain
    `ledgerloop-<part>`, for commands that are no long-running process)."""
    global _executor
    _executor = executor_id


def application_name(name: str) -> str:
    """The application_name of a connection of this process: `name` is a part's name,
    `ledgerloop-dbos`, `ledgerloop-worker`, or plain `dbos`. pg_stat_activity then tells the
    processes and their parts apart (`ledgerloop db status` counts them)."""
    part = name.removeprefix("ledgerloop-").removeprefix("ledgerloop:") or "ledgerloop"
    if _executor is None or name.startswith("ledgerloop:"):
        return name if name.startswith("ledgerloop") else f"ledgerloop-{name}"
    room = _NAME_MAX - len("ledgerloop:") - 1 - len(part)
    # The unique tail of an executor id (a random hex suffix) is kept when it is cut.
    executor = _executor[-room:] if room > 0 else ""
    return f"ledgerloop:{executor}:{part}"[:_NAME_MAX]
