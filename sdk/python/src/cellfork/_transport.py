"""The only I/O in the SDK: sending :class:`RequestSpec` s with httpx, in a
sync and an async flavour that mirror each other line for line."""

from __future__ import annotations

import asyncio
import inspect
import time
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Awaitable, Callable, Generic, Iterator, TypeVar

import httpx

from ._config import Config
from ._core import RequestSpec, RetryPolicy, check_response
from ._exceptions import APIConnectionError, CellforkError, TimeoutError
from ._streams import Call

T = TypeVar("T")


def translate_transport_error(exc: httpx.TransportError) -> CellforkError:
    """Map an httpx transport failure to the SDK's error classes."""
    if isinstance(exc, httpx.TimeoutException):
        return TimeoutError(f"request timed out: {type(exc).__name__}")
    if isinstance(exc, httpx.ConnectError):
        return APIConnectionError(f"could not connect to the cellfork daemon: {exc}")
    return APIConnectionError(f"the connection to the cellfork daemon broke: {exc!r}")


class SyncHTTP:
    """Sends requests with one pooled ``httpx.Client``. Safe for concurrent
    use from several threads (as ``httpx.Client`` is)."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        if config.transport is not None and not isinstance(config.transport, httpx.BaseTransport):
            raise TypeError("Sandbox needs a sync httpx transport (httpx.BaseTransport)")
        self.client = httpx.Client(
            base_url=config.base_url, transport=config.transport, follow_redirects=False
        )
        self.retry = retry

    def request(self, spec: RequestSpec) -> httpx.Response:
        """Send, retrying per policy; raise the typed error on failure."""
        if self.client.is_closed:
            raise closed_error()
        attempt = 0
        while True:
            try:
                response = self.client.request(spec.method, spec.path, **spec.httpx_kwargs())
            except httpx.TransportError as exc:
                delay = self.retry.retry_after_error(spec, attempt, exc)
                if delay is None:
                    raise translate_transport_error(exc) from exc
            else:
                delay = self.retry.retry_after_response(spec, attempt, response)
                if delay is None:
                    check_response(spec, response)
                    return response
            time.sleep(delay)
            attempt += 1

    def open_stream(self, spec: RequestSpec) -> httpx.Response:
        """Send and return the streamed response once its status is checked
        (2xx); the caller must close it."""
        if self.client.is_closed:
            raise closed_error()
        with translating():
            request = self.client.build_request(spec.method, spec.path, **spec.httpx_kwargs())
            response = self.client.send(request, stream=True)
        try:
            if not 200 <= response.status_code < 300:
                with translating():
                    response.read()
                check_response(spec, response)
        except BaseException:
            response.close()
            raise
        return response

    @contextmanager
    def stream(self, spec: RequestSpec) -> Iterator[httpx.Response]:
        """:meth:`open_stream` as a context manager that closes it."""
        response = self.open_stream(spec)
        try:
            yield response
        finally:
            response.close()

    def close(self) -> None:
        self.client.close()


class AsyncHTTP:
    """Sends requests with one pooled ``httpx.AsyncClient``. Use it from one
    event loop."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        if config.transport is not None and not isinstance(
            config.transport, httpx.AsyncBaseTransport
        ):
            raise TypeError("AsyncSandbox needs an async httpx transport (httpx.AsyncBaseTransport)")
        self.client = httpx.AsyncClient(
            base_url=config.base_url, transport=config.transport, follow_redirects=False
        )
        self.retry = retry

    async def request(self, spec: RequestSpec) -> httpx.Response:
        """Send, retrying per policy; raise the typed error on failure."""
        if self.client.is_closed:
            raise closed_error()
        attempt = 0
        while True:
            try:
                response = await self.client.request(spec.method, spec.path, **spec.httpx_kwargs())
            except httpx.TransportError as exc:
                delay = self.retry.retry_after_error(spec, attempt, exc)
                if delay is None:
                    raise translate_transport_error(exc) from exc
            else:
                delay = self.retry.retry_after_response(spec, attempt, response)
                if delay is None:
                    check_response(spec, response)
                    return response
            await asyncio.sleep(delay)
            attempt += 1

    async def open_stream(self, spec: RequestSpec) -> httpx.Response:
        """Send and return the streamed response once its status is checked
        (2xx); the caller must close it."""
        if self.client.is_closed:
            raise closed_error()
        with translating():
            request = self.client.build_request(spec.method, spec.path, **spec.httpx_kwargs())
            response = await self.client.send(request, stream=True)
        try:
            if not 200 <= response.status_code < 300:
                with translating():
                    await response.aread()
                check_response(spec, response)
        except BaseException:
            await response.aclose()
            raise
        return response

    @asynccontextmanager
    async def stream(self, spec: RequestSpec) -> AsyncIterator[httpx.Response]:
        """:meth:`open_stream` as a context manager that closes it."""
        response = await self.open_stream(spec)
        try:
            yield response
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self.client.aclose()


@contextmanager
def translating(read_timeout_message: str | None = None) -> Iterator[None]:
    """Re-raise httpx transport errors as SDK errors (for stream reads)."""
    try:
        yield
    except httpx.ReadTimeout as exc:
        if read_timeout_message is None:
            raise translate_transport_error(exc) from exc
        raise TimeoutError(read_timeout_message) from exc
    except httpx.TransportError as exc:
        raise translate_transport_error(exc) from exc


def closed_error() -> CellforkError:
    return CellforkError(
        "this sandbox object is closed (after close() or leaving its `with` block); "
        "use connect() to attach to a running sandbox again"
    )


class SyncReader(Generic[T]):
    """Runs ``fn`` once, when :meth:`result` is first called, and keeps its
    result or exception: the sync twin of :class:`AsyncReader` (a sync
    command's output is read by ``wait()``, not in the background). Not
    safe for concurrent use."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn: Callable[[], T] | None = fn
        self._result: T | None = None
        self._error: BaseException | None = None

    def result(self) -> T:
        if self._fn is not None:
            fn, self._fn = self._fn, None
            try:
                self._result = fn()
            except BaseException as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def cancel(self) -> None:
        """Never run ``fn`` (if it has not run); :meth:`result` then raises."""
        if self._fn is not None:
            self._fn = None
            self._error = CellforkError("the command's output stream was closed before it was read")


class AsyncReader(Generic[T]):
    """Runs ``fn`` in a background task from now on (a background
    command's output streams to its callbacks while the caller does other
    things). Use it from one event loop."""

    def __init__(self, fn: Callable[[], Awaitable[T]]) -> None:
        self._task = asyncio.ensure_future(fn())

    async def result(self) -> T:
        return await self._task

    async def cancel(self) -> None:
        """Cancel the task if it still runs, and wait until it has ended."""
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass


def fire(calls: list[Call]) -> None:
    for callback, arg in calls:
        callback(arg)


async def afire(calls: list[Call]) -> None:
    """Call callbacks; await those that are coroutine functions."""
    for callback, arg in calls:
        result = callback(arg)
        if inspect.isawaitable(result):
            await result
