"""CPU time by process, read from Linux's /proc: where a benchmark's work ran, not just how
long it took. On a shared two-core machine a job's wall time moves with everything else
that runs; the CPU its own processes spent moves much less.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import psycopg

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of `pid` (with `children`: plus that of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone meanwhile, or not Linux
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def _postmaster(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])


class ProcessCpu:
    """CPU seconds spent so far by this process, by the Postgres cluster serving `url` (its
    postmaster, live children and the children it has reaped) and by `others` (pid by name)."""

    def __init__(self, url: str, others: dict[str, int]) -> None:
        self.postmaster = _postmaster(url)
        self.others = others

    def _postgres(self) -> float:
        total = _stat_seconds(self.postmaster, children=True)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.postmaster:
                total += _stat_seconds(int(entry.name))
        return total

    def sample(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out = {"this process": usage.ru_utime + usage.ru_stime, "postgres": self._postgres()}
        for name, pid in self.others.items():
            out[name] = _stat_seconds(pid)
        return out

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in before}
