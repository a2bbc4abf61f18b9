"""The HTTP API (/v1), the approval page (/approvals) and /healthz.

`create_app(database_url, agent_names=...)` builds the FastAPI app; `serve_http` runs it inside
`ledgerloop up`. Errors map to statuses in `errors`, tokens to principals in `auth`.
"""

from ledgerloop.http.app import create_app
from ledgerloop.http.server import serve_http

__all__ = ["create_app", "serve_http"]
