"""Incremental parser for newline-delimited JSON (the code interpreter's
``/execute`` stream)."""

from __future__ import annotations

import json
from typing import Any

from ._exceptions import ProtocolError

MAX_LINE_BYTES = 64 * 1024 * 1024


class NDJSONDecoder:
    """Feed raw bytes, get one dict per complete line. Blank lines (and
    ``\\r\\n`` endings) are tolerated. Not safe for concurrent use."""

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line_bytes

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        start = 0
        while True:
            nl = self._buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(self._buf[start:nl])
            start = nl + 1
            obj = _parse_line(line)
            if obj is not None:
                out.append(obj)
        del self._buf[:start]
        if len(self._buf) > self._max:
            raise ProtocolError(f"stream line longer than {self._max} bytes")
        return out

    def close(self) -> list[dict[str, Any]]:
        """Parse a final line that had no trailing newline."""
        line, self._buf = bytes(self._buf), bytearray()
        obj = _parse_line(line)
        return [obj] if obj is not None else []


def _parse_line(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        raise ProtocolError(f"stream line is not JSON: {line[:200]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"stream line is not a JSON object: {line[:200]!r}")
    return obj
