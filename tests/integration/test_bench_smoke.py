"""Every benchmark in scripts/bench runs once at its tiny size (LEDGERLOOP_BENCH_SMOKE=1) and
writes a well-formed result into a temporary directory, never into docs/benchmarks/: a bench
that no longer runs, or no longer publishes, fails here instead of on the day it is needed.
The figures of a smoke run mean nothing; only their shape is checked.

Outside tools: `sandbox` needs bwrap and gVisor, which scripts/install-sandbox installs (it
fails here without them, as the sandbox tests do). `turn` compares with LangGraph only when
the `bench` extra is installed, which the project's scripts do not install: that one column of
`turn` is left out of the smoke run, by design, and `turn` says so in its output."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerloop.testing.postgres import ENV_URL, PostgresServer
from scripts.benchmarks.results import KEYS, RESULTS_ENV, SMOKE_ENV, load

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "scripts" / "bench"
#: Modules under scripts/benchmarks with a main that are not benches: a part of one, the report.
HELPERS = {"restart_bare", "idle_bare", "report"}


def _listed() -> list[str]:
    """The names scripts/bench runs when given none."""
    match = re.search(r"names=\(([a-z_ ]+)\)", BENCH.read_text())
    assert match, "scripts/bench no longer lists its benches as names=(...)"
    return match.group(1).split()


BENCHES = _listed()
#: Benches that start worker processes or many runs: seconds become tens of seconds.
SLOW = {
    "dispatch",
    "takeover",
    "restart",
    "waiting_runs",
    "idle",
    "purge",
    "streams",
    "streams_text",
    "model_limits",
}


def test_every_bench_module_is_listed() -> None:
    modules = {
        path.stem
        for path in (REPO / "scripts" / "benchmarks").glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }
    assert modules - HELPERS == set(BENCHES), "add the bench to the names in scripts/bench"


def _param(name: str) -> object:
    if name in SLOW:
        return pytest.param(name, marks=[pytest.mark.long, pytest.mark.timeout(300)])
    return name


@pytest.mark.parametrize("name", [_param(n) for n in BENCHES])
def test_bench_runs_at_smoke_size(name: str, tmp_path: Path, pg_server: PostgresServer) -> None:
    env = {
        **os.environ,
        # The suite's Postgres: a bench's database() then skips building a cluster of its own
        # (the benches that count statements still build theirs, with pg_stat_statements).
        ENV_URL: pg_server.admin_url,
        SMOKE_ENV: "1",
        RESULTS_ENV: str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(REPO / "app"), str(REPO)]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", f"scripts.benchmarks.{name}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280 if name in SLOW else 110,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    written = tmp_path / f"{name}.json"
    assert written.exists(), f"{name} printed its figures but did not publish them"
    data = json.loads(written.read_text())
    assert set(KEYS) <= set(data)
    result = load(written)
    assert result.bench == name
    assert result.command.endswith(f"scripts/bench {name}")
    assert result.source.startswith("smoke run")
    assert result.measures
    assert result.machine.cores
    assert result.machine.postgres or name == "sandbox"
    assert result.figures
    for figure in result.figures:
        if isinstance(figure.value, float):
            assert math.isfinite(figure.value), figure
