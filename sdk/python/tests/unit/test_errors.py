"""Mapping of server answers to exception classes."""

import builtins
import json

import pytest

import cellfork
from cellfork import (
    AuthenticationError,
    CellforkError,
    CommandExitError,
    CommandResult,
    ConflictError,
    InternalServerError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    SandboxNotFoundError,
    SandboxUnavailableError,
    ServiceBusyError,
    TimeoutError,
)
from cellfork._exceptions import error_from_connect, error_from_response, parse_retry_after


def _err(status, body, headers=None, **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return error_from_response(status, raw, headers or {}, **kw)


@pytest.mark.parametrize(
    "status,cls",
    [
        (400, InvalidArgumentError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (409, ConflictError),
        (422, InvalidArgumentError),
        (429, RateLimitError),
        (500, InternalServerError),
        (502, SandboxUnavailableError),
        (503, ServiceBusyError),
        (504, TimeoutError),
        (418, CellforkError),
    ],
)
def test_control_plane_status_mapping(status, cls):
    err = _err(status, {"code": status, "message": "nope"}, {"X-Request-Id": "req-1"})
    assert type(err) is cls
    assert err.status_code == status
    assert err.message == "nope"
    assert err.request_id == "req-1"
    assert "req-1" in str(err) and "nope" in str(err)


def test_sandbox_lookup_404():
    err = _err(404, {"code": 404, "message": "sandbox x not found"}, sandbox_lookup=True)
    assert type(err) is SandboxNotFoundError
    assert isinstance(err, NotFoundError)


def test_connect_error_body_uses_code_name():
    err = _err(404, {"code": "not_found", "message": "path not found"})
    assert type(err) is NotFoundError and err.code == "not_found"
    err = _err(400, {"code": "failed_precondition", "message": "paused"})
    assert type(err) is ConflictError and err.status_code == 400


def test_non_json_and_empty_bodies():
    err = _err(500, b"kernel died\n")
    assert type(err) is InternalServerError and err.message == "kernel died"
    err = _err(503, b"", reason="Service Unavailable")
    assert err.message == "Service Unavailable"
    err = _err(400, {"code": 400})
    assert err.message == '{"code": 400}'


def test_retry_after_is_parsed_onto_the_error():
    err = _err(429, {"code": 429, "message": "slow down"}, {"retry-after": "3"})
    assert err.retry_after == 3.0


def test_parse_retry_after_forms():
    assert parse_retry_after(None) is None
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0) == 6.0


@pytest.mark.parametrize(
    "code,cls,status",
    [
        ("invalid_argument", InvalidArgumentError, 400),
        ("unauthenticated", AuthenticationError, 401),
        ("already_exists", ConflictError, 409),
        ("resource_exhausted", RateLimitError, 429),
        ("unavailable", ServiceBusyError, 503),
        ("canceled", TimeoutError, 499),
        ("internal", InternalServerError, 500),
        ("made_up", CellforkError, 500),
    ],
)
def test_connect_codes(code, cls, status):
    err = error_from_connect(code, "m")
    assert type(err) is cls and err.status_code == status


def test_timeout_error_is_also_the_builtin():
    assert issubclass(TimeoutError, builtins.TimeoutError)
    assert issubclass(TimeoutError, CellforkError)


def test_every_exported_error_is_a_cellfork_error():
    for name in cellfork.__all__:
        obj = getattr(cellfork, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, CellforkError), name


def test_command_exit_error_carries_the_result():
    result = CommandResult(stdout="out", stderr="bad thing\n", exit_code=3)
    err = CommandExitError(result, request_id="r")
    assert err.result is result
    assert (err.exit_code, err.stdout, err.stderr, err.error) == (3, "out", "bad thing\n", None)
    assert "code 3" in str(err) and "bad thing" in str(err)
