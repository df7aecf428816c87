"""Pure state machines for the two streamed answers: code execution (NDJSON
events from ``/execute``) and process output (Connect ``ProcessEvent``s from
``process.Process/Start``).

They do no I/O and never call user callbacks themselves: ``handle`` returns
the calls to make, so the sync twin calls them and the async twin calls and
awaits them. Not safe for concurrent use.
"""

from __future__ import annotations

import base64
import binascii
import codecs
from typing import Any, Callable

from ._exceptions import ProtocolError
from ._models import CommandResult, Execution, ExecutionError, Result

Callback = Callable[[Any], Any]
Call = tuple[Callback, Any]


class ExecutionAccumulator:
    """Builds an :class:`Execution` from ``/execute`` stream events."""

    def __init__(
        self,
        *,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_result: Callback | None = None,
        on_error: Callback | None = None,
    ) -> None:
        self.execution = Execution()
        self.finished = False
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_result = on_result
        self._on_error = on_error

    def handle(self, event: dict[str, Any]) -> list[Call]:
        kind = event.get("type")
        ex = self.execution
        if kind == "stdout":
            text = str(event.get("text", ""))
            ex.logs.stdout.append(text)
            return _call(self._on_stdout, text)
        if kind == "stderr":
            text = str(event.get("text", ""))
            ex.logs.stderr.append(text)
            return _call(self._on_stderr, text)
        if kind == "result":
            result = Result.from_json({k: v for k, v in event.items() if k != "type"})
            ex.results.append(result)
            return _call(self._on_result, result)
        if kind == "error":
            tb = event.get("traceback", "")
            if isinstance(tb, list):
                tb = "\n".join(str(line) for line in tb)
            ex.error = ExecutionError(
                name=str(event.get("name", "")), value=str(event.get("value", "")), traceback=str(tb)
            )
            return _call(self._on_error, ex.error)
        if kind == "number_of_executions":
            count = event.get("execution_count")
            ex.execution_count = int(count) if count is not None else None
        elif kind == "end_of_execution":
            self.finished = True
        # keepalive, unexpected_end_of_execution and unknown types: nothing to do.
        return []

    def finish(self) -> Execution:
        if not self.finished and self.execution.error is None:
            raise ProtocolError("code execution stream ended without end_of_execution")
        return self.execution


class ProcessAccumulator:
    """Builds a :class:`CommandResult` from ``ProcessEvent`` messages.

    The first message must be ``start``; output bytes are decoded as UTF-8
    incrementally (a character split across messages is kept whole).
    """

    def __init__(
        self, *, on_stdout: Callback | None = None, on_stderr: Callback | None = None
    ) -> None:
        self.pid: int | None = None
        self.ended = False
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._out: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._dec = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in self._out
        }
        self._exit_code = 0
        self._error: str | None = None

    @property
    def started(self) -> bool:
        return self.pid is not None

    def handle(self, message: dict[str, Any]) -> list[Call]:
        event = message.get("event")
        if not isinstance(event, dict):
            raise ProtocolError(f"process stream message without event: {message!r}")
        if self.pid is None:
            start = event.get("start")
            if not isinstance(start, dict):
                raise ProtocolError(f"expected start event first, got {sorted(event)}")
            self.pid = int(start.get("pid", 0))
            return []
        calls: list[Call] = []
        data = event.get("data")
        if isinstance(data, dict):
            for name in ("stdout", "stderr"):
                if name in data:
                    text = self._dec[name].decode(decode_bytes(data[name]))
                    if text:
                        calls += self._emit(name, text)
        end = event.get("end")
        if isinstance(end, dict):
            self.ended = True
            self._exit_code = int(end.get("exitCode", end.get("exit_code", 0)) or 0)
            self._error = end.get("error") or None
        return calls

    def _emit(self, name: str, text: str) -> list[Call]:
        self._out[name].append(text)
        return _call(self._on[name], text)

    def finish(self) -> tuple[CommandResult, list[Call]]:
        """Flush decoders and return the result (call after end-of-stream)."""
        calls: list[Call] = []
        for name, dec in self._dec.items():
            tail = dec.decode(b"", final=True)
            if tail:
                calls += self._emit(name, tail)
        if self.pid is None:
            raise ProtocolError("process stream ended before the start event")
        if not self.ended:
            raise ProtocolError("command ended without an end event")
        result = CommandResult(
            stdout="".join(self._out["stdout"]),
            stderr="".join(self._out["stderr"]),
            exit_code=self._exit_code,
            error=self._error,
        )
        return result, calls


def decode_bytes(value: Any) -> bytes:
    """Decode a proto3-JSON ``bytes`` field: standard or URL-safe base64,
    padding optional."""
    if not isinstance(value, str):
        raise ProtocolError(f"expected base64 string, got {type(value).__name__}")
    padded = value + "=" * (-len(value) % 4)
    try:
        if "-" in value or "_" in value:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid base64 in stream message") from None


def _call(callback: Callback | None, arg: Any) -> list[Call]:
    return [(callback, arg)] if callback is not None else []
