"""Errors as OpenAI shapes them: ``{"error": {"message", "type", "param", "code"}}``.

Handlers registered by :func:`install_handlers` turn every failure into that body: our own
:class:`APIError`, Starlette's HTTP errors (unknown route 404, wrong verb 405) and anything
unexpected (500, logged, no internals in the message).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["FULL_STATUS", "APIError", "error_body", "error_response", "install_handlers"]

log = logging.getLogger("verispec.server")

#: A server's answer when its rows and its queue are full (Ray Serve's ingress offers such a
#: refusal to the router again).
FULL_STATUS = 429
#: HTTP status -> OpenAI error type.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               404: "not_found_error", 405: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    """A request failure with its HTTP status, the field it concerns and a short code."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "server_error" if self.status >= 500
                               else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = str(exc.detail)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    err = APIError(exc.status_code, message, code=code, headers=dict(exc.headers or {}))
    return error_response(err)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(APIError(500, f"internal server error ({type(exc).__name__})",
                                   code="internal_error"))


def install_handlers(app: FastAPI) -> None:
    """Every error the app answers gets the OpenAI body."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
