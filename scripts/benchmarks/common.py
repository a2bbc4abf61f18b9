"""Shared set-up: a real Postgres (the test provider order), a fresh migrated database, the
scripted model, and a worker running the benchmark inside its event loop."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ledgerloop.agent.definition import EXAMPLE_AGENT_MODULE
from ledgerloop.config import Settings, load_settings
from ledgerloop.models.script import Script, parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runtime import Runtime
from ledgerloop.testing.postgres import DatabaseFactory, postgres_server, wait_until
from ledgerloop.testing.worker import WorkerThread
from ledgerloop.worker import WorkerOptions
from scripts.benchmarks import results

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def database() -> Iterator[str]:
    with postgres_server() as server:
        factory = DatabaseFactory(server.admin_url)
        url = factory.create()
        results.used_database(url)
        try:
            yield url
        finally:
            factory.drop(url)
            factory.close()


@contextmanager
def scripted(text: str) -> Iterator[ScriptedModelServer]:
    script: Script = parse_script(text)
    with ScriptedModelServer(script) as server:
        yield server


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until `url` answers 200 (a service `proc` started); fails at once if `proc` exits."""

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            return httpx.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30)


@dataclass(frozen=True)
class ModelProcess:
    url: str


@contextmanager
def scripted_process(text: str) -> Iterator[ModelProcess]:
    """The scripted model in a process of its own, as a real model service is: its work does
    not compete with the worker's for the worker's interpreter lock."""
    from ledgerloop.db.cluster import free_port

    parse_script(text)  # a bad script fails here, with the parser's message
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.yaml"
        path.write_text(text)
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ledgerloop.models.scripted_server",
                "--script",
                str(path),
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/_requests", proc)
            yield ModelProcess(url)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@contextmanager
def policy_file(text: str) -> Iterator[Path]:
    """A tool policy file with `text`, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.yaml"
        path.write_text(text)
        yield path


def settings_for(url: str, model_url: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": url,
        "anthropic_base_url": model_url,
        "policy_file": REPO / "tool_policy.yaml",
        "agent_modules": (EXAMPLE_AGENT_MODULE,),
        "home": REPO / ".ledgerloop",
    }
    return load_settings(**{**base, **overrides})


def run_in_worker(
    settings: Settings,
    url: str,
    body: Callable[[Runtime], Awaitable[dict[str, Any]]],
    services: list[Any] | None = None,
) -> dict[str, Any]:
    """Start a worker, run `body` inside its event loop (where DBOS workflows run), stop."""
    result: dict[str, Any] = {}

    async def service(runtime: Runtime, stop: asyncio.Event) -> None:
        try:
            result.update(await body(runtime))
        finally:
            stop.set()

    options = WorkerOptions(services=[*(services or []), service])
    worker = WorkerThread(settings, url, options)
    worker.start()
    worker._thread.join(timeout=3600)
    worker.stop()
    return result


def per_unit_ms(samples: list[float], units: int) -> float:
    """Median of the samples, per unit, in milliseconds."""
    return statistics.median(samples) / units * 1000


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


def report(title: str, rows: list[tuple[str, float, str]]) -> None:
    results.reported(title, rows)  # what `results.publish` writes at the end of the run
    print(f"\n{title}")
    for name, value, note in rows:
        print(f"  {name:<52} {value:>9.3f}  {note}")
