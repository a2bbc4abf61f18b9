"""Run a Ledgerloop worker in a background thread, for in-process tests and benchmarks."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ledgerloop.config import Settings
from ledgerloop.runtime import Runtime
from ledgerloop.worker import WorkerOptions, run_worker


class WorkerThread:
    """`with WorkerThread(settings, url) as worker:` runs a worker until the block ends."""

    def __init__(self, settings: Settings, url: str, options: WorkerOptions | None = None) -> None:
        self.settings = settings
        self.url = url
        self.options = options
        self.runtime: Runtime | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="ledgerloop-worker", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(runtime: Runtime) -> None:
                self.runtime = runtime
                self._ready.set()

            await run_worker(self.settings, self.url, self._stop, self.options, ready)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def start(self, timeout: float = 60) -> WorkerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("worker did not start")
        if self._error:
            raise self._error
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._loop and self._stop and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._error and not isinstance(self._error, (KeyboardInterrupt, SystemExit)):
            raise self._error

    def __enter__(self) -> WorkerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
