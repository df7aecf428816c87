"""Exception classes, one per failure kind, and the single place that maps
server answers (HTTP status, control-plane JSON, Connect error codes) to them.
"""

from __future__ import annotations

import builtins
import email.utils
import json
import time
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from ._models import CommandResult

__all__ = [
    "CellforkError",
    "APIConnectionError",
    "ProtocolError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "SandboxNotFoundError",
    "InvalidArgumentError",
    "ConflictError",
    "RateLimitError",
    "ServiceBusyError",
    "SandboxUnavailableError",
    "InternalServerError",
    "TimeoutError",
    "CommandExitError",
]


class CellforkError(Exception):
    """Base class of every error the SDK raises.

    ``status_code`` is the HTTP status (None when no response was received),
    ``message`` the server's user-facing message, ``request_id`` the value of
    the response header ``X-Request-Id`` (quote it when reporting a problem),
    ``code`` the server's symbolic code when it sent one (e.g. a Connect code
    such as ``"not_found"``), and ``retry_after`` the server's ``Retry-After``
    in seconds, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        request_id: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.request_id = request_id
        self.code = code
        self.retry_after = retry_after

    def __str__(self) -> str:
        parts = []
        if self.status_code is not None:
            parts.append(f"status {self.status_code}")
        if self.request_id:
            parts.append(f"request id {self.request_id}")
        return f"{self.message} ({', '.join(parts)})" if parts else self.message


class APIConnectionError(CellforkError):
    """The daemon could not be reached (connection refused, reset, DNS...)."""


class ProtocolError(CellforkError):
    """The server's answer did not follow the wire protocol."""


class AuthenticationError(CellforkError):
    """401: missing or wrong API key or sandbox access token."""


class PermissionDeniedError(CellforkError):
    """403: authenticated, but not allowed."""


class NotFoundError(CellforkError):
    """404: the file, process, context or other object does not exist."""


class SandboxNotFoundError(NotFoundError):
    """404 on a sandbox lookup: no such sandbox (or it was killed)."""


class InvalidArgumentError(CellforkError):
    """400/413/422: the request was malformed, too large, or a value was
    out of range."""


class ConflictError(CellforkError):
    """409: the object already exists or is in the wrong state."""


class RateLimitError(CellforkError):
    """429: too many requests; ``retry_after`` says when to try again."""


class ServiceBusyError(CellforkError):
    """503: the daemon is temporarily unable to serve the request."""


class SandboxUnavailableError(CellforkError):
    """502: the sandbox (or the port inside it) did not answer."""


class InternalServerError(CellforkError):
    """5xx: the daemon failed; details are in its log under ``request_id``."""


class TimeoutError(CellforkError, builtins.TimeoutError):
    """A request, command or code execution ran out of time."""


class CommandExitError(CellforkError):
    """A command exited with a non-zero code. ``result`` holds its output."""

    def __init__(self, result: "CommandResult", *, request_id: str | None = None) -> None:
        detail = f"command exited with code {result.exit_code}"
        if result.error:
            detail += f": {result.error}"
        elif result.stderr:
            detail += f": {result.stderr.strip()[-500:]}"
        super().__init__(detail, request_id=request_id)
        self.result = result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr

    @property
    def error(self) -> str | None:
        return self.result.error


# --- mapping ---------------------------------------------------------------

_STATUS_CLASSES: dict[int, type[CellforkError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: TimeoutError,
    409: ConflictError,
    413: InvalidArgumentError,
    422: InvalidArgumentError,
    429: RateLimitError,
    499: TimeoutError,
    502: SandboxUnavailableError,
    503: ServiceBusyError,
    504: TimeoutError,
}

# Connect error code -> (HTTP status per the Connect spec, class).
_CONNECT_CODES: dict[str, tuple[int, type[CellforkError]]] = {
    "canceled": (499, TimeoutError),
    "unknown": (500, InternalServerError),
    "invalid_argument": (400, InvalidArgumentError),
    "deadline_exceeded": (504, TimeoutError),
    "not_found": (404, NotFoundError),
    "already_exists": (409, ConflictError),
    "permission_denied": (403, PermissionDeniedError),
    "resource_exhausted": (429, RateLimitError),
    "failed_precondition": (400, ConflictError),
    "aborted": (409, ConflictError),
    "out_of_range": (400, InvalidArgumentError),
    "unimplemented": (501, CellforkError),
    "internal": (500, InternalServerError),
    "unavailable": (503, ServiceBusyError),
    "data_loss": (500, InternalServerError),
    "unauthenticated": (401, AuthenticationError),
}

_MAX_MESSAGE = 1000


def class_for_status(status: int) -> type[CellforkError]:
    cls = _STATUS_CLASSES.get(status)
    if cls is not None:
        return cls
    return InternalServerError if status >= 500 else CellforkError


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_from_response(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    sandbox_lookup: bool = False,
    reason: str = "",
) -> CellforkError:
    """Build the exception for a non-2xx HTTP answer.

    Understands control-plane bodies ``{"code": int, "message": str}``,
    Connect bodies ``{"code": "not_found", "message": str}`` and plain text.
    ``sandbox_lookup`` turns a 404 into :class:`SandboxNotFoundError`.
    """
    message, code = _parse_error_body(body)
    cls = class_for_status(status)
    if code is not None and code in _CONNECT_CODES:
        cls = _CONNECT_CODES[code][1]
    if sandbox_lookup and status == 404:
        cls = SandboxNotFoundError
    if not message:
        message = reason or f"HTTP {status}"
    return cls(
        message,
        status_code=status,
        request_id=_header(headers, "x-request-id"),
        code=code,
        retry_after=parse_retry_after(_header(headers, "retry-after")),
    )


def error_from_status(
    status: int, message: str, *, request_id: str | None = None
) -> CellforkError:
    """Build the exception for an error reported inside a 2xx answer, such
    as one failed child of a fork (``{"code": int, "message": str}``)."""
    cls = class_for_status(status)
    return cls(message or f"HTTP {status}", status_code=status, request_id=request_id)


def error_from_connect(
    code: str, message: str, *, request_id: str | None = None
) -> CellforkError:
    """Build the exception for a Connect error sent in an end-of-stream frame."""
    status, cls = _CONNECT_CODES.get(code, (500, CellforkError))
    return cls(message or code, status_code=status, request_id=request_id, code=code)


def _parse_error_body(body: bytes) -> tuple[str, str | None]:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data: Any = json.loads(text) if text else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        raw_code = data.get("error_code") or data.get("code")
        code = raw_code if isinstance(raw_code, str) else None
        message = data.get("message")
        if isinstance(message, str) and message:
            return message[:_MAX_MESSAGE], code
        return text[:_MAX_MESSAGE], code
    return text[:_MAX_MESSAGE], None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # plain dicts are case-sensitive; httpx.Headers is not
        for key, val in headers.items():
            if key.lower() == name:
                return val
    return value
