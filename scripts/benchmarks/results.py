"""A benchmark's result as data: what it measures, the command that produced it, its baseline
and its figures, with the machine they were taken on, written as JSON to
docs/benchmarks/NAME.json. docs/benchmarks.md is generated from those files
(scripts/bench --report); the history of every figure is the history of its file in git.

A bench calls `publish(...)` once at the end of its `main()`. Two environment variables:

- LEDGERLOOP_BENCH_SMOKE=1 runs every bench at a tiny size (`size()`), to show it still runs
  (tests/integration/test_bench_smoke.py), not to measure anything;
- LEDGERLOOP_BENCH_RESULTS=DIR writes the JSON there instead of docs/benchmarks/. A smoke run
  must name one: its figures are not figures, and the committed directory only holds real runs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "benchmarks"
SMOKE_ENV = "LEDGERLOOP_BENCH_SMOKE"
RESULTS_ENV = "LEDGERLOOP_BENCH_RESULTS"
KEYS = ("bench", "measures", "command", "baseline", "figures", "machine", "measured", "source")


def smoke() -> bool:
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


def size(env: str, full: str, tiny: str) -> str:
    """The setting `env` when given, else `tiny` in a smoke run and `full` otherwise."""
    return os.environ.get(env, tiny if smoke() else full)


@dataclass(frozen=True)
class Figure:
    """One measured figure. `value` None means not yet measured; `ratio` is to the baseline,
    where a ratio means something; `note` holds a target or what a range stands for."""

    name: str
    value: float | str | None
    unit: str = ""
    ratio: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Baseline:
    """What the figures are compared with, measured in the same run (`value` None: the
    comparison is with a target, or the baseline was not recorded as a number)."""

    what: str
    value: float | str | None = None
    unit: str = ""


@dataclass(frozen=True)
class Machine:
    cores: int | None
    postgres: str
    python: str = ""

    @staticmethod
    def here(database_url: str | None = None) -> Machine:
        import platform

        return Machine(os.cpu_count(), postgres_version(database_url), platform.python_version())

    @staticmethod
    def here_noted() -> Machine:
        import platform

        return Machine(os.cpu_count(), _POSTGRES[0] if _POSTGRES else "", platform.python_version())


@dataclass(frozen=True)
class Result:
    bench: str
    measures: str
    command: str
    baseline: Baseline
    figures: tuple[Figure, ...]
    machine: Machine
    measured: str  # ISO 8601, UTC; or the date and hours of a transcribed figure
    source: str = "scripts/bench run"

    def to_json(self) -> str:
        data = asdict(self)
        data["figures"] = [asdict(f) for f in self.figures]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def postgres_version(database_url: str | None) -> str:
    """`SHOW server_version` of the database the bench used ("" when it has none)."""
    if not database_url:
        return ""
    import psycopg

    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error:
        return ""
    return str(row[0]) if row else ""


_POSTGRES: list[str] = []


def used_database(url: str) -> None:
    """Note the server a bench's database is on (its version goes into the result)."""
    if not _POSTGRES:
        _POSTGRES.append(postgres_version(url))


def _at() -> str:
    """ " at <commit>" of the checkout measured, "+" when its code has uncommitted changes
    (the JSON files written by the benches before this one do not count)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "app", "scripts", "migrations").strip()
    except OSError:
        return ""
    return f" at {head}{'+' if dirty else ''}" if head else ""


def results_dir() -> Path:
    given = os.environ.get(RESULTS_ENV)
    if given:
        return Path(given)
    if smoke():
        raise RuntimeError(
            f"a smoke run ({SMOKE_ENV}=1) writes no committed figures: "
            f"set {RESULTS_ENV}=DIR to say where its JSON goes"
        )
    return COMMITTED


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_UNIT = re.compile(r"^(.*\S)\s*\((ms|s|%|x|MB|KB|% of one core|runs/s|deliveries/s)\)$")
_RATIO = re.compile(r"^(\d+(?:\.\d+)?)x\b")
#: The rows of this process's `report()` calls (common.py), for `publish` to write.
REPORTED: list[Figure] = []


def reported(title: str, rows: list[tuple[str, float, str]]) -> None:
    """Keep a printed table's rows as figures: a label ending in a unit in brackets, such as
    "p50 (ms)", gives the figure that unit; a ratio ("x") is its own ratio to the baseline."""
    for label, value, note in rows:
        match = _UNIT.match(label)
        name, unit = (match.group(1), match.group(2)) if match else (label, "")
        said = _RATIO.match(note)  # "1.26x the bare deletes": the row's own ratio
        ratio = value if unit == "x" else float(said.group(1)) if said else None
        REPORTED.append(Figure(f"{title}: {name}", _rounded(value), unit, ratio, note))


def _rounded(value: float) -> float:
    """Four significant digits: more would be noise on this machine, and churn in git."""
    return float(f"{value:.4g}")


def measures_of(doc: str | None) -> str:
    """A module docstring's first paragraph, as one line: what the bench measures."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def publish(
    bench: str,
    doc: str | None,
    baseline: Baseline,
    figures: list[Figure] | None = None,
    *,
    database_url: str | None = None,
    command: str | None = None,
) -> Path:
    """Write this run's result as `bench`'s JSON; returns the file written. `doc` is the
    bench module's docstring (its first paragraph says what it measures); `figures` default
    to the rows its `report()` calls printed."""
    figures = list(REPORTED) if figures is None else figures
    if isinstance(baseline.value, float):
        baseline = Baseline(baseline.what, _rounded(baseline.value), baseline.unit)
    if not _NAME.match(bench):
        raise ValueError(f"bench name {bench!r}: use lower case letters, digits and _")
    if not figures:
        raise ValueError(f"{bench}: publish at least one figure")
    result = Result(
        bench=bench,
        measures=measures_of(doc),
        command=command or f"scripts/bench {bench}",
        baseline=baseline,
        figures=tuple(figures),
        machine=Machine.here(database_url) if database_url else Machine.here_noted(),
        measured=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source="smoke run (tiny sizes, not a measurement)"
        if smoke()
        else f"scripts/bench run{_at()}",
    )
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench}.json"
    path.write_text(result.to_json())
    print(f"  figures written to {path}")
    return path


def load(path: Path) -> Result:
    """A result file back as a `Result`; a missing key names the file and the key."""
    data = json.loads(path.read_text())
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise ValueError(
            f"{path}: missing {', '.join(missing)} (see scripts/benchmarks/results.py)"
        )
    return Result(
        bench=data["bench"],
        measures=data["measures"],
        command=data["command"],
        baseline=Baseline(**data["baseline"]),
        figures=tuple(Figure(**f) for f in data["figures"]),
        machine=Machine(**data["machine"]),
        measured=data["measured"],
        source=data["source"],
    )
