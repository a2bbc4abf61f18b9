"""Installed from a built wheel into a fresh environment, next to a project with its own `app`.

The wheel is built from this checkout and installed with pip (no editable install, no source
tree on the path); the fresh environment borrows the dependencies from this one's
site-packages through a path entry, so nothing is downloaded but the build backend.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import psycopg
import pytest

from ledgerloop.db.cluster import free_port
from ledgerloop.testing.postgres import DatabaseFactory, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env=env, check=False, **kwargs
    )  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc  # type: ignore[no-any-return]


def _user_env(database_url: str) -> dict[str, str]:
    """What a newcomer's shell would have: a database URL and nothing else of ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_", "PYTHONPATH", "VIRTUAL_ENV"))
    }
    env["LEDGERLOOP_DATABASE_URL"] = database_url
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    # Built from a clean copy: setuptools reuses a checkout's build/ directory, whose files
    # from an earlier build would hide what the configuration leaves out.
    source = root / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("app", "migrations"):
        shutil.copytree(REPO / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root), str(source)])
    (built,) = root.glob("ledgerloop-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> tuple[Path, Path, set[str]]:
    """(the fresh environment's python, its site-packages, the names the install added)."""
    root = tmp_path_factory.mktemp("install")
    env_dir = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    # The dependencies, from this environment (a path entry: its .pth files, the editable
    # install of this checkout among them, are not processed).
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = set(os.listdir(site))
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)])
    added = set(os.listdir(site)) - before - {"__pycache__"}
    return python, site, added


def test_ledgerloop_is_the_only_new_top_level_name(
    installed: tuple[Path, Path, set[str]],
) -> None:
    _, _, added = installed
    importable = {name for name in added if not name.endswith((".dist-info", ".pth"))}
    assert importable == {"ledgerloop"}, added
    assert any(name.startswith("ledgerloop-") and name.endswith(".dist-info") for name in added)


def test_a_project_with_its_own_app_package_imports_both(
    installed: tuple[Path, Path, set[str]], tmp_path: Path
) -> None:
    python, site, _ = installed
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text('NAME = "the project app"\n')
    script = (
        "import sys, app, ledgerloop, ledgerloop.cli\n"
        "print(app.NAME)\n"
        "print(ledgerloop.__file__)\n"
        "print(ledgerloop.Agent.__module__, ledgerloop.start_run.__name__)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'app'))\n"
    )
    out = _run([str(python), "-c", script], cwd=str(project)).stdout.splitlines()
    assert out[0] == "the project app"
    assert Path(out[1]).is_relative_to(site), out[1]
    assert out[2] == "ledgerloop.agent.definition start_run"
    assert out[3] == "['app']"


def test_db_upgrade_works_from_the_wheel(
    installed: tuple[Path, Path, set[str]], db_factory: DatabaseFactory, tmp_path: Path
) -> None:
    python, _, _ = installed
    url = db_factory.create(migrated=False)
    try:
        _run(
            [str(python.parent / "ledgerloop"), "db", "upgrade"],
            cwd=str(tmp_path),
            env={"LEDGERLOOP_DATABASE_URL": url},
        )
        heads = sorted(
            p.name.split("_")[0] for p in (REPO / "migrations" / "versions").glob("0*.py")
        )
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT version_num FROM ledgerloop.alembic_version").fetchone()
        assert row is not None
        assert row[0] == heads[-1]
    finally:
        db_factory.drop(url)


def test_the_examples_import_from_the_wheel_with_their_data(
    installed: tuple[Path, Path, set[str]], tmp_path: Path
) -> None:
    python, site, _ = installed
    # The investigate example binds its file tools to its data directory at import: a wheel
    # without the directory could not import it.
    script = (
        "from ledgerloop.examples import analyst, investigate\n"
        "print(investigate.DATA_ROOT)\n"
        "print(sorted(p.name for p in investigate.DATA_ROOT.rglob('*') if p.is_file()))\n"
        "print(analyst.DATA_FILE.is_file())\n"
    )
    out = _run([str(python), "-c", script], cwd=str(tmp_path)).stdout.splitlines()
    assert Path(out[0]).is_relative_to(site), out[0]
    assert out[1] == "['checkout.log', 'checkout.yaml', 'postgres.log']"
    assert out[2] == "True"  # the analyst's data file ships too


def test_the_wheel_holds_every_data_file_of_the_package(wheel: Path) -> None:
    # Every file under app/ledgerloop that is not Python is loaded by the code (SQL, the
    # approval page, model scripts, the examples' data): each must be in the wheel, and the
    # migrations' template with them.
    source = REPO / "app" / "ledgerloop"
    data = {
        "ledgerloop/" + p.relative_to(source).as_posix()
        for p in source.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    assert "ledgerloop/http/static/approvals.html" in data
    assert "ledgerloop/http/static/console.js" in data
    assert "ledgerloop/models/scripts/ops_demo.yaml" in data
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    assert not data - shipped, sorted(data - shipped)
    assert "ledgerloop/_migrations/script.py.mako" in shipped
    # The demo's policy is the repository's, copied into the package: kept the same.
    packaged = source / "examples" / "tool_policy.yaml"
    assert packaged.read_text() == (REPO / "tool_policy.yaml").read_text()


def test_demo_and_the_approval_page_work_from_the_wheel(
    installed: tuple[Path, Path, set[str]], db_url: str, tmp_path: Path
) -> None:
    python, site, _ = installed
    env = _user_env(db_url)
    where = _run(
        [str(python), "-c", "import ledgerloop; print(ledgerloop.__file__)"],
        cwd=str(tmp_path),
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), where  # the wheel's copy, not this checkout's

    ledgerloop = str(python.parent / "ledgerloop")
    demo = subprocess.run(
        [ledgerloop, "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "no ANTHROPIC_API_KEY: scripted model" in demo.stdout
    assert "tickets filed: 1" in demo.stdout

    port = free_port()
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [ledgerloop, "up", "--no-relay"],
            cwd=tmp_path,
            env={
                **env,
                "LEDGERLOOP_HTTP_PORT": str(port),
                "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # no run is started
                "LEDGERLOOP_AGENT_MODULES": "ledgerloop.examples.ops_agent",
                # The examples' policy as the wheel ships it (the demo's, too).
                "LEDGERLOOP_POLICY_FILE": str(site / "ledgerloop/examples/tool_policy.yaml"),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            def healthy() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    return http.get("/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(healthy, timeout=90)
            page = http.get("/approvals")
            assert page.status_code == 200, page.text[:500]
            assert "<html" in page.text.lower()
            for asset in ("approvals.js", "approvals.css"):
                assert asset in page.text
                assert http.get(f"/static/{asset}").status_code == 200, asset
            console = http.get("/console")
            assert console.status_code == 200, console.text[:500]
            for asset in ("console.js", "console.css"):
                assert asset in console.text
                assert http.get(f"/static/{asset}").status_code == 200, asset
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
