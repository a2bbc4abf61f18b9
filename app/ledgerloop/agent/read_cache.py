"""The worker's cache of read-tool results, each kept for its policy's TTL."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any


class ReadCache:
    """Read-tool results by (tenant, agent, tool, arguments), each for its policy's TTL.

    In the worker process only: read tools are side-effect free, so a miss after a restart
    costs one more call. Keyed by tenant (one tenant's answer is never another's) and agent
    (two agents' tools may share a name); bounded to `max_entries`, least recently used out
    first, so a stream of distinct arguments cannot grow the worker without limit.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    @staticmethod
    def key(tenant_id: str, agent: str, tool: str, arguments: Any) -> str:
        return json.dumps([tenant_id, agent, tool, arguments], sort_keys=True, default=str)

    def get(self, key: str) -> Any:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= time.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, key: str, ttl: float, value: Any) -> None:
        self._entries[key] = (time.monotonic() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


#: One per worker process (READ_CACHE_ENTRIES results at most).
READ_CACHE_ENTRIES = 1024
READ_CACHE = ReadCache(READ_CACHE_ENTRIES)
