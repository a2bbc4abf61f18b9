"""The plugin's test Postgres, chosen the way a user's run chooses it: in a pytest run of its
own, with the plugin found through its entry point.

With LEDGERLOOP_TEST_DATABASE_URL unset and no Docker engine answering, the run falls back to
a throwaway local cluster and its last lines say so (and why); with the URL set, the URL wins
and no cluster is started. The second run also proves that a script file name given to the
plugin is found next to the test file, whatever directory pytest started in.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerloop.testing.postgres import PostgresServer

PROVIDER_TEST = """
import psycopg


def test_the_server_takes_connections(ledgerloop_postgres):
    with psycopg.connect(ledgerloop_postgres.admin_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
"""

SCRIPT_TEST = """
import anthropic


def test_a_script_file_next_to_this_test(ledgerloop_model):
    model = ledgerloop_model("conversation.yaml")
    client = anthropic.Anthropic(base_url=model.url, api_key="test", max_retries=0)
    reply = client.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    client.close()
    assert reply.content[0].text == "from the file beside the test"
"""

CONVERSATION = """
default:
  turns:
    - text: "from the file beside the test"
"""

LINE = re.compile(r"^ledgerloop: test Postgres from (.+)$", re.MULTILINE)


def _project(root: Path) -> None:
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (root / "test_provider.py").write_text(PROVIDER_TEST)
    nested = root / "nested"
    nested.mkdir()
    (nested / "test_script.py").write_text(SCRIPT_TEST)
    (nested / "conversation.yaml").write_text(CONVERSATION)


def _run(root: Path, **env: str) -> str:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "LEDGERLOOP_TEST_DATABASE_URL", "DOCKER_HOST", "DOCKER_CONTEXT")
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q"],
        cwd=root,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture
def nobody_listens() -> Iterator[str]:
    """DOCKER_HOST for a socket file nobody listens on: an engine that stopped uncleanly."""
    # Not tmp_path: a unix socket's path must fit in 108 bytes.
    directory = Path(tempfile.mkdtemp(prefix="ll-dk-", dir="/tmp"))
    path = directory / "docker.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    yield f"unix://{path}"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.timeout(300)
def test_without_a_url_or_docker_the_run_uses_a_local_cluster_and_says_why(
    tmp_path: Path, nobody_listens: str
) -> None:
    _project(tmp_path)
    out = _run(tmp_path, DOCKER_HOST=nobody_listens)
    assert re.search(r"^2 passed\b", out, re.MULTILINE), out[-2000:]
    assert LINE.findall(out) == [f"local-cluster (no Docker engine answered at {nobody_listens})"]


@pytest.mark.timeout(300)
def test_a_url_in_the_environment_wins(
    tmp_path: Path, nobody_listens: str, pg_server: PostgresServer
) -> None:
    _project(tmp_path)
    out = _run(
        tmp_path, LEDGERLOOP_TEST_DATABASE_URL=pg_server.admin_url, DOCKER_HOST=nobody_listens
    )
    assert re.search(r"^2 passed\b", out, re.MULTILINE), out[-2000:]
    assert LINE.findall(out) == ["env (LEDGERLOOP_TEST_DATABASE_URL)"]
