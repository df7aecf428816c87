"""Connect envelope codec."""

import struct

import pytest

from cellfork import NotFoundError, ProtocolError, TimeoutError
from cellfork._envelope import (
    FLAG_END_STREAM,
    EnvelopeDecoder,
    encode_envelope,
    raise_for_end_stream,
)


def test_encode_frames_compact_json():
    data = encode_envelope({"process": {"pid": 7}})
    flags, length = struct.unpack(">BI", data[:5])
    assert flags == 0
    assert data[5:] == b'{"process":{"pid":7}}'
    assert length == len(data) - 5


def test_decode_byte_by_byte_round_trip():
    stream = (
        encode_envelope({"event": {"start": {"pid": 1}}})
        + encode_envelope({"event": {"data": {"stdout": "aGkK"}}})
        + encode_envelope({}, flags=FLAG_END_STREAM)
    )
    dec = EnvelopeDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    dec.close()
    assert [e.message for e in got] == [
        {"event": {"start": {"pid": 1}}},
        {"event": {"data": {"stdout": "aGkK"}}},
        {},
    ]
    assert [e.end_stream for e in got] == [False, False, True]
    assert dec.ended


def test_empty_payload_is_empty_object():
    (env,) = EnvelopeDecoder().feed(struct.pack(">BI", 2, 0))
    assert env.end_stream and env.message == {}


@pytest.mark.parametrize(
    "code,cls,status",
    [("not_found", NotFoundError, 404), ("deadline_exceeded", TimeoutError, 504)],
)
def test_end_stream_error_is_typed(code, cls, status):
    (env,) = EnvelopeDecoder().feed(
        encode_envelope({"error": {"code": code, "message": "boom"}}, flags=FLAG_END_STREAM)
    )
    with pytest.raises(cls) as info:
        raise_for_end_stream(env, request_id="r1")
    assert info.value.message == "boom"
    assert info.value.status_code == status
    assert info.value.code == code
    assert info.value.request_id == "r1"


def test_end_stream_without_error_is_silent():
    (env,) = EnvelopeDecoder().feed(encode_envelope({"metadata": {"a": ["b"]}}, flags=2))
    raise_for_end_stream(env)


def test_compressed_flag_is_rejected():
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().feed(encode_envelope({}, flags=1))


def test_truncated_stream_is_rejected():
    dec = EnvelopeDecoder()
    assert dec.feed(encode_envelope({"a": 1})[:-2]) == []
    with pytest.raises(ProtocolError):
        dec.close()


def test_message_after_end_stream_is_rejected():
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().feed(encode_envelope({}, flags=2) + encode_envelope({}))


@pytest.mark.parametrize("payload", [b"not json", b"[1,2]"])
def test_bad_payload_is_protocol_error(payload):
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().feed(struct.pack(">BI", 0, len(payload)) + payload)


def test_oversized_length_is_rejected_before_buffering():
    with pytest.raises(ProtocolError):
        EnvelopeDecoder(max_message_bytes=10).feed(struct.pack(">BI", 0, 11))
