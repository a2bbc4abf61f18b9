"""Is there a Docker engine to start a test Postgres in? Asked fast, and never left hanging.

Looked for where the docker client itself would look, first found first asked:

1. `DOCKER_HOST`, when set: the user said where, so nothing else is tried (the CLI does the same);
2. the client's current context (`DOCKER_CONTEXT`, else `currentContext` in
   `$DOCKER_CONFIG/config.json`, default `~/.docker/config.json`), unless it is `default`;
3. a rootless engine's socket, `$XDG_RUNTIME_DIR/docker.sock`;
4. Docker Desktop's `~/.docker/run/docker.sock`;
5. the system socket, `/var/run/docker.sock`.

A plain socket (unix or tcp without TLS) is asked `GET /_ping` directly: no client library
imported, one second at most. TLS and ssh hosts go through the docker client, in a thread we
stop waiting for after a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

#: How long one candidate may take to answer before we call it absent.
PING_TIMEOUT_S = 1.0
#: The docker client (TLS, ssh) gets longer: it has a handshake to do.
CLIENT_TIMEOUT_S = 3.0


def docker_candidates() -> list[str]:
    """The hosts to ask, as DOCKER_HOST URLs, in the order above."""
    configured = os.environ.get("DOCKER_HOST")
    if configured:
        return [configured]
    hosts: list[str] = []
    context = context_host()
    if context:
        hosts.append(context)
    home = Path.home()
    sockets = [
        Path(os.environ["XDG_RUNTIME_DIR"]) / "docker.sock"
        if os.environ.get("XDG_RUNTIME_DIR")
        else None,
        home / ".docker" / "run" / "docker.sock",
        Path("/var/run/docker.sock"),
    ]
    for path in sockets:
        if path is not None and path.is_socket():
            url = f"unix://{path}"
            if url not in hosts:
                hosts.append(url)
    return hosts


def context_host() -> str | None:
    """The docker endpoint of the client's current context, or None for `default` (whose
    endpoint is the system socket, tried anyway) and for any config we cannot read."""
    config_dir = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    name = os.environ.get("DOCKER_CONTEXT")
    try:
        if not name:
            config = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
            name = config.get("currentContext") if isinstance(config, dict) else None
        if not name or name == "default":
            return None
        # The CLI stores a context's metadata under the sha256 of its name.
        digest = hashlib.sha256(name.encode()).hexdigest()
        meta = json.loads(
            (config_dir / "contexts" / "meta" / digest / "meta.json").read_text(encoding="utf-8")
        )
        host = meta["Endpoints"]["docker"]["Host"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return host if isinstance(host, str) and host else None


def find_docker_engine() -> tuple[str | None, list[str]]:
    """(the first host whose engine answers, or None; every host asked)."""
    asked = docker_candidates()
    for host in asked:
        if engine_answers(host):
            return host, asked
    return None, asked


def engine_answers(host: str) -> bool:
    """Whether the engine at `host` answers its ping in time."""
    parts = urlsplit(host)
    tls = bool(os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_CERT_PATH"))
    if parts.scheme in ("unix", "http+unix"):
        return _raw_ping(socket.AF_UNIX, parts.path)
    if parts.scheme in ("tcp", "http") and not tls and parts.hostname:
        return _raw_ping(socket.AF_INET, (parts.hostname, parts.port or 2375))
    return _client_ping(host)


def _raw_ping(family: socket.AddressFamily, address: str | tuple[str, int]) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(PING_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64).split(b"\r\n", 1)[0]
    except OSError:
        return False
    return status_line.startswith(b"HTTP/1.") and b" 200" in status_line


def _client_ping(host: str) -> bool:
    answered: list[bool] = []

    def ping() -> None:
        try:
            import docker

            timeout = int(CLIENT_TIMEOUT_S)
            # from_env also reads DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, which go with
            # DOCKER_HOST; a context's host is taken as it is.
            client = (
                docker.from_env(timeout=timeout)
                if host == os.environ.get("DOCKER_HOST")
                else docker.DockerClient(base_url=host, timeout=timeout)
            )
            try:
                answered.append(bool(client.ping()))
            finally:
                client.close()
        except Exception:
            answered.append(False)

    # Some transports (ssh) do not honour the client's timeout on connect: a daemon thread we
    # stop waiting for bounds the probe whatever the transport does.
    thread = threading.Thread(target=ping, name="docker-probe", daemon=True)
    thread.start()
    thread.join(CLIENT_TIMEOUT_S + 0.5)
    return bool(answered and answered[0])
