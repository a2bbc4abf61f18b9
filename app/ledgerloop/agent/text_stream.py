"""The think step's text, published as the model writes it (streams/publish.py).

One publisher (one writer thread) per runtime's pool in the process, made on first use.
"""

from __future__ import annotations

import threading

from ledgerloop.runtime import Runtime
from ledgerloop.streams.publish import CallText, TextPublisher

_publishers: dict[int, TextPublisher] = {}
_lock = threading.Lock()


def call_text(rt: Runtime, run_id: str, step: str) -> CallText:
    """Where a model call of `step` hands its text deltas."""
    pool = rt.pool
    with _lock:
        publisher = _publishers.get(id(pool))
        if publisher is None:
            publisher = _publishers[id(pool)] = TextPublisher(pool.connection)
    return publisher.open(run_id, step)
