"""Every error the API answers with, decided in one place: `{"error": {type, message, fix}}`.

A LedgerloopError's status comes from its `status_code` attribute, else from its type in
STATUS_BY_TYPE, never from its text. Bad input is always a 4xx with the reason; anything
unexpected is a 500 with a generic message, and the details go to the log only.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledgerloop.db.errors import (
    DatabaseMissing,
    DatabasePrivilegeError,
    DatabaseUnreachable,
    DatabaseUrlInvalid,
    SchemaOutdated,
)
from ledgerloop.effects.errors import (
    EffectNotFound,
    EffectNotResolvable,
    InvalidCompensation,
    InvalidDeliveryRequest,
    KeyReuse,
    RetryUnsafe,
)
from ledgerloop.errors import ConfigError, LedgerloopError
from ledgerloop.runs.states import InvalidTransition
from ledgerloop.runs.store import RunNotFound, RunStopped, StaleRun

log = logging.getLogger("ledgerloop.http")


class ErrorDetail(BaseModel):
    type: str
    message: str
    fix: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# -- errors the HTTP layer itself raises --------------------------------------------------


class InvalidRequest(LedgerloopError):
    """The request does not match the API's schema."""

    status_code: ClassVar[int] = 422


class MalformedJson(LedgerloopError):
    """The request body is not valid JSON."""

    status_code: ClassVar[int] = 400


class PayloadTooLarge(LedgerloopError):
    """The request body is over the 256 KiB limit."""

    status_code: ClassVar[int] = 413

    def __init__(self) -> None:
        super().__init__(fix="send at most 256 KiB; keep large documents elsewhere and pass ids")


class UnsupportedMediaType(LedgerloopError):
    """The request body must be JSON."""

    status_code: ClassVar[int] = 415


class UnknownAgent(LedgerloopError):
    """No agent is registered under this name."""

    status_code: ClassVar[int] = 422


class IdempotencyKeyReused(LedgerloopError):
    """The Idempotency-Key was already used for a different request."""

    status_code: ClassVar[int] = 422


#: Statuses of errors that do not carry their own `status_code`. The most specific type wins.
STATUS_BY_TYPE: dict[type[LedgerloopError], int] = {
    RunNotFound: 404,
    EffectNotFound: 404,
    InvalidTransition: 409,
    StaleRun: 409,
    RunStopped: 409,
    KeyReuse: 409,
    EffectNotResolvable: 409,
    RetryUnsafe: 409,
    InvalidCompensation: 409,
    InvalidDeliveryRequest: 422,
    # The server's own problems: the caller can do nothing about them but retry.
    DatabaseUnreachable: 503,
    DatabaseMissing: 500,
    DatabasePrivilegeError: 500,
    DatabaseUrlInvalid: 500,
    SchemaOutdated: 500,
    ConfigError: 500,
}

#: The error type for the statuses Starlette raises itself (unknown route, wrong method...).
_HTTP_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
}


def status_for(exc: LedgerloopError) -> int:
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_TYPE:
            return STATUS_BY_TYPE[cls]
    # A LedgerloopError is by definition one the caller can act on (a wrong value, a wrong
    # state) unless it is listed above as the server's problem.
    return 400


def error_type(exc: BaseException) -> str:
    """`ApprovalConflict` -> `approval_conflict`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(exc).__name__).lower()


def error_json(
    status: int,
    type_: str,
    message: str,
    fix: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(type=type_, message=message, fix=fix))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def ledgerloop_error_response(exc: LedgerloopError) -> JSONResponse:
    status = status_for(exc)
    if status >= 500:
        # The server's problem (database down or misconfigured): the operator reads the log;
        # the caller learns only whether retrying may help.
        log.error("request failed: %s", exc.one_line())
        return unavailable() if exc.retryable else internal_error()
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return error_json(status, error_type(exc), exc.message, exc.fix, headers)


def unavailable() -> JSONResponse:
    return error_json(
        503, "unavailable", "the database is unavailable", "retry later", {"Retry-After": "5"}
    )


def internal_error() -> JSONResponse:
    return error_json(
        500,
        "internal_error",
        "the server failed to handle this request",
        "retry later; the operator's log has the details",
    )


def _describe(errors: Sequence[Any]) -> str:
    parts = []
    for error in errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    decode = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if decode is not None:
        position = decode.get("loc", ("body", "?"))[-1]
        reason = (decode.get("ctx") or {}).get("error", "invalid JSON")
        return ledgerloop_error_response(
            MalformedJson(
                f"the request body is not valid JSON: {reason} at character {position}",
                fix="send a JSON document with Content-Type: application/json",
            )
        )
    return ledgerloop_error_response(
        InvalidRequest(_describe(errors), fix="see /openapi.json for the request schema")
    )


async def _ledgerloop_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LedgerloopError)
    return ledgerloop_error_response(exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 413:  # raised by the body guard while a body streams in
        return ledgerloop_error_response(PayloadTooLarge())
    message = {
        404: f"no route {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    fix = {404: "see /openapi.json for the routes"}.get(exc.status_code)
    return error_json(
        exc.status_code,
        _HTTP_TYPES.get(exc.status_code, "http_error"),
        message,
        fix,
        dict(exc.headers) if exc.headers else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(LedgerloopError, _ledgerloop_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(CatchUnexpected)


class CatchUnexpected:
    """Anything no handler knows becomes a logged 500 with a generic body.

    A middleware rather than an `Exception` handler: Starlette re-raises after running that
    handler, so the server would log every error twice and a test client would raise.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            response = _unexpected(scope, exc)
            if started:
                raise  # too late for an error body; the server closes the connection
            await response(scope, receive, send)


def _unexpected(scope: Scope, exc: Exception) -> JSONResponse:
    if isinstance(exc, psycopg.DataError):
        # A value Postgres refuses (out of range, a NUL character...) is the caller's input.
        return error_json(
            422,
            "invalid_value",
            f"a value was refused by the database: {exc.diag.message_primary or exc}",
            "check the request's values",
        )
    if isinstance(exc, psycopg.OperationalError):  # also the pool's timeout
        log.error("database unavailable on %s %s: %s", scope["method"], scope["path"], exc)
        return unavailable()
    # Request headers (and so tokens) are never logged: only the route and the exception.
    log.exception("unexpected error on %s %s", scope["method"], scope["path"])
    return internal_error()


# -- values JSON allows and Postgres refuses ---------------------------------------------


def storable_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (a lone surrogate is not)") from None
    return value


def json_storable(value: Any, where: str = "input") -> None:
    """Raise ValueError for what JSON parsers accept but Postgres jsonb refuses."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} holds a number out of range ({value})")
    if isinstance(value, str):
        storable_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            storable_text(key)
            json_storable(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            json_storable(item, f"{where}[{i}]")


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route may answer with."""
    described = {
        400: "Malformed JSON or an invalid value",
        401: "No token, or an invalid or revoked one",
        403: "The principal lacks the role this action needs",
        404: "No such resource in the caller's tenant",
        409: "The resource's state does not allow this",
        413: "The request body is over 256 KiB",
        415: "The request body is not JSON",
        422: "The request does not match the schema",
        503: "The database is unavailable",
    }
    chosen: Iterable[int] = statuses or described
    return {status: {"model": ErrorResponse, "description": described[status]} for status in chosen}
