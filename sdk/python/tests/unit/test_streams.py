"""The pure stream state machines."""

import pytest

from cellfork import CommandResult, ExecutionError, ProtocolError, Result
from cellfork._streams import ExecutionAccumulator, ProcessAccumulator, decode_bytes


def _run(acc, events):
    calls = []
    for e in events:
        calls += acc.handle(e)
    return calls


def test_execution_accumulates_and_orders_callbacks():
    seen = []
    acc = ExecutionAccumulator(
        on_stdout=lambda t: seen.append(("out", t)),
        on_stderr=lambda t: seen.append(("err", t)),
        on_result=lambda r: seen.append(("res", r.text)),
    )
    calls = _run(acc, [
        {"type": "stdout", "text": "a\n", "timestamp": "2026-01-01T00:00:00Z"},
        {"type": "keepalive"},
        {"type": "stderr", "text": "w\n"},
        {"type": "result", "text": "<Figure>", "png": "iVBORw0KGgo=", "is_main_result": False},
        {"type": "result", "text": "2", "html": "<b>2</b>", "is_main_result": True,
         "extra": {"application/x-thing": 1}, "unknown_key": 5},
        {"type": "number_of_executions", "execution_count": 4},
        {"type": "end_of_execution"},
    ])
    for cb, arg in calls:
        cb(arg)
    assert seen == [("out", "a\n"), ("err", "w\n"), ("res", "<Figure>"), ("res", "2")]
    ex = acc.finish()
    assert ex.text == "2"
    assert ex.logs.stdout == ["a\n"] and ex.logs.stderr == ["w\n"]
    assert ex.execution_count == 4 and ex.error is None
    assert ex.results[0].png == "iVBORw0KGgo=" and not ex.results[0].is_main_result
    assert ex.results[1].formats() == ["text", "html", "application/x-thing"]


def test_execution_error_event():
    errors = []
    acc = ExecutionAccumulator(on_error=errors.append)
    for cb, arg in _run(acc, [{"type": "error", "name": "ZeroDivisionError",
                               "value": "division by zero", "traceback": ["l1", "l2"]},
                              {"type": "end_of_execution"}]):
        cb(arg)
    ex = acc.finish()
    assert ex.error == ExecutionError("ZeroDivisionError", "division by zero", "l1\nl2")
    assert errors == [ex.error] and ex.text is None


def test_execution_without_end_is_a_protocol_error():
    acc = ExecutionAccumulator()
    _run(acc, [{"type": "stdout", "text": "x"}])
    with pytest.raises(ProtocolError):
        acc.finish()


def _ev(**event):
    return {"event": event}


def test_process_happy_path_with_split_utf8():
    snow = "\u2603".encode()  # 3 bytes
    import base64
    part = lambda b: base64.b64encode(b).decode()
    out = []
    acc = ProcessAccumulator(on_stdout=out.append)
    calls = _run(acc, [
        _ev(start={"pid": 42}),
        _ev(data={"stdout": part(b"hi " + snow[:1])}),
        _ev(keepalive={}),
        _ev(data={"stdout": part(snow[1:] + b"\n")}),
        _ev(data={"stderr": part(b"warn")}),
        _ev(end={"exited": True, "status": "exit status 0"}),
    ])
    for cb, arg in calls:
        cb(arg)
    assert acc.pid == 42
    result, tail = acc.finish()
    assert tail == []
    assert result == CommandResult(stdout="hi \u2603\n", stderr="warn", exit_code=0, error=None)
    assert "".join(out) == "hi \u2603\n"


def test_process_exit_code_and_error():
    acc = ProcessAccumulator()
    _run(acc, [_ev(start={"pid": 1}),
               _ev(end={"exitCode": -1, "exited": False, "status": "signal: killed",
                        "error": "killed"})])
    result, _ = acc.finish()
    assert result.exit_code == -1 and result.error == "killed"


def test_process_must_start_with_start():
    with pytest.raises(ProtocolError):
        ProcessAccumulator().handle(_ev(keepalive={}))


def test_process_without_end_is_a_protocol_error():
    acc = ProcessAccumulator()
    acc.handle(_ev(start={"pid": 1}))
    with pytest.raises(ProtocolError):
        acc.finish()


def test_decode_bytes_is_lenient():
    assert decode_bytes("aGk") == b"hi"
    assert decode_bytes("aGk=") == b"hi"
    assert decode_bytes("-_8") == b"\xfb\xff"
    with pytest.raises(ProtocolError):
        decode_bytes("!!")
    with pytest.raises(ProtocolError):
        decode_bytes(5)


def test_result_from_json_ignores_unknown_and_none():
    r = Result.from_json({"text": "x", "svg": None, "foo": 1, "is_main_result": True})
    assert r.text == "x" and r.svg is None and r.is_main_result
