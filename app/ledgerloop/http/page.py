"""The approval page and the run console: plain HTML, CSS and JS from this package, no build
step, nothing external.

The page holds no secret: the approver types a token, the script keeps it in sessionStorage
(gone with the tab) and sends it as a Bearer token to the same /v1 API everyone else uses.
A strict Content-Security-Policy allows scripts, styles and requests to this origin only, so
nothing in an approval's preview can run as code; the script also only ever sets textContent.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_MEDIA_TYPES = {
    "approvals.html": "text/html; charset=utf-8",
    "approvals.js": "text/javascript; charset=utf-8",
    "approvals.css": "text/css; charset=utf-8",
    "console.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


@cache
def _read(name: str) -> bytes:
    return files("ledgerloop.http").joinpath("static", name).read_bytes()


def _static(name: str) -> Response:
    return Response(_read(name), media_type=_MEDIA_TYPES[name], headers=_HEADERS)


@router.get("/approvals")
def approvals_page() -> Response:
    return _static("approvals.html")


@router.get("/static/approvals.js")
def approvals_script() -> Response:
    return _static("approvals.js")


@router.get("/static/approvals.css")
def approvals_style() -> Response:
    return _static("approvals.css")


@router.get("/console")
def console_page() -> Response:
    """The run console (static/console.js): runs, their timelines, and the actions on them,
    all through the same /v1 API and token as the approval page."""
    return _static("console.html")


@router.get("/static/console.js")
def console_script() -> Response:
    return _static("console.js")


@router.get("/static/console.css")
def console_style() -> Response:
    return _static("console.css")
