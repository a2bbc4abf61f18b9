"""The Docker probe behind the test Postgres provider: it looks where the docker client would
(DOCKER_HOST, the current context, the rootless and system sockets), and it gives up fast on an
engine that is absent, refuses or never answers.

The engines here are small servers on real sockets that answer `/_ping` as dockerd does (or
do not): the probe speaks HTTP to a socket, and that is what is exercised.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledgerloop.testing.docker_engine import (
    PING_TIMEOUT_S,
    context_host,
    docker_candidates,
    engine_answers,
    find_docker_engine,
)

PONG = b"HTTP/1.1 200 OK\r\nApi-Version: 1.47\r\nContent-Length: 2\r\n\r\nOK"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A unix socket's path must fit in 108 bytes; pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="ll-dk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> Path:
    """No DOCKER_* settings, and a home and runtime dir of the test's own."""
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    home = short_dir / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DOCKER_CONFIG", str(home / ".docker"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir / "run"))
    (short_dir / "run").mkdir()
    return short_dir


def _serve(server: socketserver.BaseServer) -> None:
    # A short poll: shutdown() waits for the loop to notice, up to one interval.
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()


def _handler(reply: bytes | None) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(1024)
            if reply is None:
                time.sleep(PING_TIMEOUT_S * 3)  # an engine that hangs
            else:
                self.request.sendall(reply)

    return Handler


@pytest.fixture
def unix_engine() -> Iterator[Callable[..., str]]:
    """`start(path, reply=PONG)` -> the DOCKER_HOST URL of an engine listening at `path`."""
    servers: list[socketserver.UnixStreamServer] = []

    def start(path: Path, reply: bytes | None = PONG) -> str:
        server = socketserver.ThreadingUnixStreamServer(str(path), _handler(reply))
        server.daemon_threads = True
        servers.append(server)
        _serve(server)
        return f"unix://{path}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _dead_socket(path: Path) -> str:
    """A socket file nobody listens on (an engine that stopped without removing it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    return f"unix://{path}"


def test_docker_host_is_the_only_place_asked_when_set(
    clean_env: Path, unix_engine: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    unix_engine(clean_env / "run" / "docker.sock")  # a live rootless engine, not to be asked
    dead = _dead_socket(clean_env / "nobody.sock")
    monkeypatch.setenv("DOCKER_HOST", dead)
    started = time.monotonic()
    assert find_docker_engine() == (None, [dead])
    assert time.monotonic() - started < 0.5


def test_a_socket_path_that_does_not_exist_is_no_engine(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = f"unix://{clean_env}/missing.sock"
    monkeypatch.setenv("DOCKER_HOST", missing)
    assert find_docker_engine() == (None, [missing])


def test_a_rootless_engine_is_found_in_the_runtime_dir(
    clean_env: Path, unix_engine: Callable[..., str]
) -> None:
    url = unix_engine(clean_env / "run" / "docker.sock")
    assert docker_candidates()[0] == url
    host, asked = find_docker_engine()
    assert host == url
    assert asked[0] == url


def test_docker_desktops_socket_is_a_candidate(
    clean_env: Path, unix_engine: Callable[..., str]
) -> None:
    (clean_env / "home" / ".docker" / "run").mkdir(parents=True)
    url = unix_engine(clean_env / "home" / ".docker" / "run" / "docker.sock")
    assert url in docker_candidates()
    assert engine_answers(url)


def _write_context(config_dir: Path, name: str, host: str, *, current: bool) -> None:
    meta = config_dir / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "meta.json").write_text(
        json.dumps({"Name": name, "Endpoints": {"docker": {"Host": host}}})
    )
    if current:
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "config.json").write_text(json.dumps({"currentContext": name}))


def test_the_current_context_comes_first(
    clean_env: Path, unix_engine: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = clean_env / "home" / ".docker"
    rootless = unix_engine(clean_env / "run" / "docker.sock")
    in_context = unix_engine(clean_env / "ctx.sock")
    _write_context(config_dir, "colima", in_context, current=True)
    assert docker_candidates()[:2] == [in_context, rootless]
    assert find_docker_engine()[0] == in_context
    # DOCKER_CONTEXT names another context, as it does for the CLI.
    other = unix_engine(clean_env / "other.sock")
    _write_context(config_dir, "other", other, current=False)
    monkeypatch.setenv("DOCKER_CONTEXT", "other")
    assert docker_candidates()[0] == other
    # The default context is the system socket, which is tried anyway.
    monkeypatch.setenv("DOCKER_CONTEXT", "default")
    assert docker_candidates()[0] == rootless


def test_an_unreadable_context_is_skipped(clean_env: Path) -> None:
    config_dir = clean_env / "home" / ".docker"
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text("{not json")
    assert context_host() is None
    (config_dir / "config.json").write_text(json.dumps({"currentContext": "gone"}))
    assert context_host() is None


def test_an_engine_that_never_answers_is_given_up_on_in_time(
    clean_env: Path, unix_engine: Callable[..., str]
) -> None:
    url = unix_engine(clean_env / "hangs.sock", reply=None)
    started = time.monotonic()
    assert not engine_answers(url)
    assert time.monotonic() - started < PING_TIMEOUT_S + 0.5


def test_something_else_on_the_socket_is_no_engine(
    clean_env: Path, unix_engine: Callable[..., str]
) -> None:
    assert not engine_answers(unix_engine(clean_env / "500.sock", b"HTTP/1.1 500 Oops\r\n\r\n"))
    assert not engine_answers(unix_engine(clean_env / "ssh.sock", b"SSH-2.0-OpenSSH_9.6\r\n"))


def test_a_tcp_engine_answers_and_a_closed_port_does_not(clean_env: Path) -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(PONG))
    server.daemon_threads = True
    _serve(server)
    try:
        port = server.server_address[1]
        assert engine_answers(f"tcp://127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()
    started = time.monotonic()
    assert not engine_answers(f"tcp://127.0.0.1:{port}")
    assert time.monotonic() - started < PING_TIMEOUT_S + 0.5


def test_an_engine_without_testcontainers_still_gets_a_server_from_local_binaries(
    clean_env: Path, unix_engine: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who installed `ledgerloop` without the `testing` extra has no testcontainers: an
    engine that answers must not turn into a ModuleNotFoundError. The module is hidden the way
    an absent one is (None in sys.modules makes its import raise ModuleNotFoundError)."""
    import sys

    import psycopg

    from ledgerloop.testing.postgres import ENV_URL, postgres_server

    url = unix_engine(clean_env / "run" / "docker.sock")
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setitem(sys.modules, "testcontainers", None)
    monkeypatch.setitem(sys.modules, "testcontainers.postgres", None)
    with postgres_server() as server:
        assert server.source.startswith("local-cluster ("), server.source
        assert f"a Docker engine answered at {url}" in server.source
        assert "ledgerloop[testing]" in server.source
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_testing_extra_brings_testcontainers_and_dev_brings_the_testing_extra() -> None:
    """What docs/testing.md tells users to install: `ledgerloop[testing]` has what the plugin
    uses beyond the package (pytest; testcontainers for Docker), and `dev` keeps it."""
    import tomllib

    from tests.conftest import REPO

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {spec.split(">")[0].split("<")[0] for spec in extras["testing"]}
    assert {"pytest", "testcontainers[postgres]"} <= names
    assert "ledgerloop[testing]" in extras["dev"]
