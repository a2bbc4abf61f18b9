"""A Python that runs Ledgerloop on another DBOS release, for the upgrade test.

`python_with_dbos(version)` makes (once; later runs reuse it) a virtual environment under
`.ledgerloop/dbos-releases/VERSION/` that holds that DBOS release and nothing else; a `.pth`
file puts the project's own environment after it on `sys.path`, so Ledgerloop, SQLAlchemy,
psycopg and the rest are the ones the suite runs with, and only DBOS differs. Installing one
wheel takes a second or two with a warm pip cache. `previous_minor()` asks the package index
which release precedes the installed DBOS's minor version.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version as installed_version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".ledgerloop" / "dbos-releases"


def _minor(text: str) -> tuple[int, int]:
    major, minor, *_ = text.split(".")
    return int(major), int(minor)


def previous_minor(installed: str | None = None) -> str:
    """The newest DBOS release of a minor version below the installed one, as the package
    index serves it (asked once per installed version; the answer is kept beside the venvs)."""
    installed = installed or installed_version("dbos")
    major, minor = _minor(installed)
    CACHE.mkdir(parents=True, exist_ok=True)
    known = CACHE / f"previous-of-{installed}.txt"
    if known.is_file():
        return known.read_text().strip()
    # pip's resolver picks the newest release the index serves below this minor version; its
    # JSON report (a stable format) says which.
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--quiet",
            "--report",
            "-",
            f"dbos<{major}.{minor}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (chosen,) = json.loads(report.stdout)["install"]
    found = str(chosen["metadata"]["version"])
    known.write_text(found + "\n")
    return found


def python_with_dbos(version: str) -> Path:
    """The interpreter of a venv with `dbos==version` in front of the project's environment."""
    target = CACHE / version
    python = target / "bin" / "python"
    ready = target / ".ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once make it once
        if not ready.is_file():
            shutil.rmtree(target, ignore_errors=True)  # a half-made one from a killed run
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", str(target)],
                check=True,
                timeout=120,
            )
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "--python",
                    str(python),
                    "install",
                    "--no-deps",
                    "--quiet",
                    f"dbos=={version}",
                ],
                check=True,
                timeout=300,
            )
            ready.write_text(version + "\n")
        # Rewritten every time: the project's environment may have moved since.
        site = Path(
            subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
        )
        ours = sysconfig.get_paths()["purelib"]
        (site / "zz_ledgerloop_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def dbos_version_of(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('dbos'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
