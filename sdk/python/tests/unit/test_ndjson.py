"""NDJSON stream parser."""

import pytest

from cellfork import ProtocolError
from cellfork._ndjson import NDJSONDecoder


def test_lines_split_across_chunks():
    dec = NDJSONDecoder()
    data = b'{"type":"stdout","text":"a\\n"}\n{"type":"result","text":"2"}\n'
    out = []
    for i in range(0, len(data), 7):
        out += dec.feed(data[i : i + 7])
    assert out == [{"type": "stdout", "text": "a\n"}, {"type": "result", "text": "2"}]
    assert dec.close() == []


def test_blank_lines_and_crlf_are_tolerated():
    dec = NDJSONDecoder()
    assert dec.feed(b'\n\r\n{"a":1}\r\n\n') == [{"a": 1}]


def test_final_line_without_newline():
    dec = NDJSONDecoder()
    assert dec.feed(b'{"a":1}\n{"b":2}') == [{"a": 1}]
    assert dec.close() == [{"b": 2}]


def test_multibyte_utf8_split_between_chunks():
    line = '{"text":"h\u00e9llo \u2603"}\n'.encode()
    dec = NDJSONDecoder()
    out = []
    for b in line:
        out += dec.feed(bytes([b]))
    assert out == [{"text": "h\u00e9llo \u2603"}]


@pytest.mark.parametrize("line", [b"nope\n", b"[1]\n", b'"str"\n'])
def test_invalid_lines(line):
    with pytest.raises(ProtocolError):
        NDJSONDecoder().feed(line)


def test_line_limit():
    with pytest.raises(ProtocolError):
        NDJSONDecoder(max_line_bytes=8).feed(b'{"a": "0123456789"')
