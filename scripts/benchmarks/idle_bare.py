"""Bare DBOS, idle: the baseline of the idle benchmark. A DBOS app with one queue and one
workflow registered, launched on its own database, that runs nothing.

    python -m scripts.benchmarks.idle_bare DATABASE_URL
"""

from __future__ import annotations

import sys
import threading

from dbos import DBOS, DBOSPortableJSONSerializer


@DBOS.workflow(name="bench_idle_bare")
def bench_idle_bare(text: str) -> str:
    return text


def main(url: str) -> None:
    DBOS(
        config={
            "name": "bench_idle_bare",
            "system_database_url": url,
            "application_version": "bench-idle-bare",
            "executor_id": "bench-idle-bare",
            "serializer": DBOSPortableJSONSerializer(),
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    DBOS.register_queue("bench_idle_bare")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
