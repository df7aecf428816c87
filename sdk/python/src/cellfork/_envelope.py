"""Connect streaming envelopes (JSON codec).

Each message on a Connect stream is framed as one flag byte, a 4-byte
big-endian payload length, and the payload. Flag 0x00 is a data message,
0x02 marks the end-of-stream frame whose JSON payload is ``{}`` or
``{"error": {"code": ..., "message": ...}, "metadata": {...}}``. Compression
(flag 0x01) is never negotiated, so a compressed frame is a protocol error.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from ._exceptions import ProtocolError, error_from_connect

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02

_HEADER = struct.Struct(">BI")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def encode_envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """Frame one JSON message."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(payload)) + payload


@dataclass(frozen=True)
class Envelope:
    flags: int
    message: dict[str, Any]

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)


class EnvelopeDecoder:
    """Incremental decoder: feed raw bytes, get whole envelopes back.

    Not safe for concurrent use.
    """

    def __init__(self, *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_message_bytes
        self.ended = False

    def feed(self, data: bytes) -> list[Envelope]:
        self._buf += data
        out: list[Envelope] = []
        while len(self._buf) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(self._buf)
            if length > self._max:
                raise ProtocolError(f"stream message of {length} bytes exceeds the limit")
            if len(self._buf) < _HEADER.size + length:
                break
            payload = bytes(self._buf[_HEADER.size : _HEADER.size + length])
            del self._buf[: _HEADER.size + length]
            if self.ended:
                raise ProtocolError("stream message after end-of-stream")
            if flags & FLAG_COMPRESSED:
                raise ProtocolError("compressed stream message was not negotiated")
            out.append(Envelope(flags, _decode_json(payload)))
            if flags & FLAG_END_STREAM:
                self.ended = True
        return out

    def close(self) -> None:
        """Check that the stream did not stop inside a frame."""
        if self._buf:
            raise ProtocolError(f"stream ended inside a message ({len(self._buf)} bytes left)")


def raise_for_end_stream(envelope: Envelope, *, request_id: str | None = None) -> None:
    """Raise the error carried by an end-of-stream frame, if any."""
    error = envelope.message.get("error")
    if error:
        if not isinstance(error, dict):
            raise ProtocolError(f"malformed end-of-stream error: {error!r}")
        raise error_from_connect(
            str(error.get("code") or "unknown"),
            str(error.get("message") or ""),
            request_id=request_id,
        )


def _decode_json(payload: bytes) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise ProtocolError(f"stream message is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("stream message is not a JSON object")
    return value
