"""Ledgerloop's pytest plugin: fixtures for proving your own agents crash-safe.

Installed with the package (entry point `pytest11`), so any project that installs Ledgerloop
has these fixtures without importing anything:

- `ledgerloop_postgres`: a Postgres server for the session, from LEDGERLOOP_TEST_DATABASE_URL,
  else testcontainers when a Docker engine answers and testcontainers is installed (the
  `ledgerloop[testing]` extra), else a throwaway cluster from local binaries; the end of the
  run says which.
- `ledgerloop_database`: a fresh, migrated database for this test (its URL).
- `ledgerloop_model`: start a scripted Messages API server from a script file (a Path, or a
  file name ending in .yaml/.yml/.json, relative to the test file's directory), YAML text or
  a dict; the real `anthropic` SDK talks to it over HTTP and it records every request.
- `ledgerloop_downstream`: start a recording downstream that counts real side effects, and
  honours idempotency keys unless told not to.
- `ledgerloop_crash`: a `CrashHarness` for one case of the crash matrix, wired to the above.

Settings in the `[tool.pytest.ini_options]` (or pytest.ini) of your project:
`ledgerloop_agent_modules` (modules that register your agents) and `ledgerloop_policy_file`
(your tool policy, relative to the project root). docs/testing.md shows a whole test.

Everything heavy is imported inside the fixtures, so the plugin costs nothing in test runs
that do not use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ledgerloop.models.scripted_server import ScriptedModelServer
    from ledgerloop.testing.crash import CrashHarness
    from ledgerloop.testing.downstream import RecordingDownstream
    from ledgerloop.testing.postgres import DatabaseFactory, PostgresServer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "ledgerloop_agent_modules",
        "modules that register the agents under test (Ledgerloop's crash fixtures)",
        type="linelist",
        default=[],
    )
    parser.addini(
        "ledgerloop_policy_file",
        "the tool policy the agents under test run with, relative to the project root",
        default="tool_policy.yaml",
    )


@pytest.fixture(scope="session")
def ledgerloop_postgres(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    from ledgerloop.testing.postgres import postgres_server

    with postgres_server() as server:
        request.config.stash[_PROVIDER] = server.source
        yield server


_PROVIDER = pytest.StashKey[str]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under pytest-xdist the fixture runs in the workers: each hands its provider to the
    # controller, which is the process that prints the summary.
    workeroutput = getattr(session.config, "workeroutput", None)
    source = session.config.stash.get(_PROVIDER, None)
    if workeroutput is not None and source is not None:
        workeroutput["ledgerloop_postgres"] = source


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    # An xdist hook, called in the controller as each worker ends (absent without xdist).
    source = getattr(node, "workeroutput", {}).get("ledgerloop_postgres")
    if source is not None:
        node.config.stash[_PROVIDER] = source


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    # Said at the end, where output capture cannot swallow it: which provider the run used.
    source = config.stash.get(_PROVIDER, None)
    if source is not None:
        terminalreporter.write_line(f"ledgerloop: test Postgres from {source}")


@pytest.fixture(scope="session")
def ledgerloop_database_factory(ledgerloop_postgres: PostgresServer) -> Iterator[DatabaseFactory]:
    from ledgerloop.testing.postgres import DatabaseFactory

    factory = DatabaseFactory(ledgerloop_postgres.admin_url)
    yield factory
    factory.close()


@pytest.fixture
def ledgerloop_database(ledgerloop_database_factory: DatabaseFactory) -> Iterator[str]:
    url = ledgerloop_database_factory.create()
    yield url
    ledgerloop_database_factory.drop(url)


ModelFactory = Callable[[str | Path | Mapping[str, Any]], "ScriptedModelServer"]

#: A `str` script ending in one of these (and on one line) names a file, not YAML text.
SCRIPT_SUFFIXES = (".yaml", ".yml", ".json")


@pytest.fixture
def ledgerloop_model(request: pytest.FixtureRequest) -> Iterator[ModelFactory]:
    from ledgerloop.models.scripted_server import ScriptedModelServer

    servers: list[ScriptedModelServer] = []
    # A script file named relatively sits next to the test that names it, as fixtures' data
    # files usually do, wherever pytest was started from.
    here = Path(str(request.path)).parent

    def start(script: str | Path | Mapping[str, Any]) -> ScriptedModelServer:
        server = ScriptedModelServer(load_test_script(script, here)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def load_test_script(script: str | Path | Mapping[str, Any], here: Path) -> Any:
    """The script a test passed: a dict; a Path, or a one-line str ending in .yaml, .yml or
    .json, naming a file (relative to `here`, the test file's directory); else YAML text.
    Anything else raises one `pytest.UsageError` that says what was passed and what would do."""
    import yaml

    from ledgerloop.models.script import ScriptError, load_script, parse_script

    if isinstance(script, Mapping):
        return parse_script(yaml.safe_dump(dict(script)))
    one_line = isinstance(script, Path) or "\n" not in script.strip()
    if isinstance(script, Path) or (one_line and script.strip().lower().endswith(SCRIPT_SUFFIXES)):
        path = Path(script.strip() if isinstance(script, str) else script)
        resolved = path if path.is_absolute() else here / path
        if not resolved.is_file():
            raise pytest.UsageError(
                f"ledgerloop: script {str(script)!r} names no file: {resolved} does not exist. "
                f"A relative name is looked up in the test file's directory ({here}); pass an "
                "absolute Path, or the YAML text itself"
            )
        return load_script(resolved)
    try:
        return parse_script(script)
    except ScriptError as exc:
        if not one_line:
            raise  # YAML text with a mistake in it: the script error names the field
        raise pytest.UsageError(
            f"ledgerloop: script {script!r} is neither a script file nor a script ({exc}). "
            f"Pass a file name ending in {', '.join(SCRIPT_SUFFIXES)} (relative to the test "
            "file's directory), a Path, YAML text with a `default:` or `conversations:` "
            "mapping, or a dict"
        ) from exc


@pytest.fixture
def ledgerloop_downstream() -> Iterator[Callable[..., RecordingDownstream]]:
    from ledgerloop.testing.downstream import RecordingDownstream

    started: list[RecordingDownstream] = []

    def start(*, honours_keys: bool = True) -> RecordingDownstream:
        downstream = RecordingDownstream(honours_keys=honours_keys).start()
        started.append(downstream)
        return downstream

    yield start
    for downstream in started:
        downstream.stop()


@pytest.fixture
def ledgerloop_crash(
    request: pytest.FixtureRequest,
    ledgerloop_database: str,
    ledgerloop_model: ModelFactory,
    ledgerloop_downstream: Callable[..., RecordingDownstream],
    tmp_path: Path,
) -> Iterator[Callable[..., CrashHarness]]:
    """`ledgerloop_crash(script=..., destinations=[...], one_process=False)` -> a CrashHarness;
    every destination named points at one recording downstream (`harness.downstream`), or,
    given a mapping of names to URLs, at your own servers, which report what they performed
    to `harness.downstream` (`record()`, or `POST harness.downstream.report_url`).
    `one_process`: a worker that runs the relay, as `ledgerloop up` does, instead of a worker
    and a relay apart. Processes are stopped after the test."""
    from ledgerloop.testing.crash import CrashHarness, harness_env

    harnesses: list[CrashHarness] = []
    root = Path(str(request.config.rootpath))

    def make(
        *,
        script: str | Path | Mapping[str, Any],
        destinations: list[str] | tuple[str, ...] | Mapping[str, str] = (),
        honours_keys: bool = True,
        agent_modules: list[str] | None = None,
        policy_file: str | Path | None = None,
        one_process: bool = False,
    ) -> CrashHarness:
        model = ledgerloop_model(script)
        downstream = ledgerloop_downstream(honours_keys=honours_keys)
        modules = agent_modules or list(request.config.getini("ledgerloop_agent_modules"))
        if not modules:
            raise pytest.UsageError(
                "ledgerloop_crash needs the modules that register your agents: set "
                "ledgerloop_agent_modules in your pytest configuration or pass agent_modules="
            )
        policy = Path(policy_file or request.config.getini("ledgerloop_policy_file"))
        policy = policy if policy.is_absolute() else root / policy
        if not policy.is_file():
            raise pytest.UsageError(
                f"ledgerloop_crash: no tool policy at {policy}; set ledgerloop_policy_file "
                "or pass policy_file="
            )
        # The worker must import the user's modules the way this test process does.
        pythonpath = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
        env = harness_env(
            agent_modules=modules,
            policy_file=policy,
            model_url=model.url,
            # A mapping names the user's own servers: they count themselves (they report to
            # the recorder), so nothing of theirs is sent through it.
            destinations=(
                dict(destinations)
                if isinstance(destinations, Mapping)
                else {name: downstream.url for name in destinations}
            ),
            pythonpath=pythonpath,
        )
        logs = tmp_path / f"crash-{len(harnesses)}"
        logs.mkdir()
        harness = CrashHarness(
            ledgerloop_database, model, downstream, env, logs, one_process=one_process
        )
        harnesses.append(harness)
        return harness

    yield make
    for harness in harnesses:
        harness.stop()
