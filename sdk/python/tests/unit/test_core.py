"""Request building, configuration and the retry policy (no I/O)."""

import base64
import json
import struct

import httpx
import pytest

from cellfork import InvalidArgumentError
from cellfork._config import DEFAULT_URL, resolve_config
from cellfork._core import (
    ApiCore,
    Limits,
    CreatedSandbox,
    RequestSpec,
    RetryPolicy,
    SandboxCore,
)


def _core(**kw):
    config = resolve_config(base_url="http://d:1/", api_key="k", **kw)
    created = CreatedSandbox("sbx1", "base", "0.6.13", "tok", None)
    return SandboxCore(config, created)


def _render(spec: RequestSpec) -> httpx.Request:
    """What httpx would put on the wire for this spec."""
    kw = spec.httpx_kwargs()
    kw.pop("timeout")
    return httpx.Client(base_url="http://d:1").build_request(spec.method, spec.path, **kw)


def test_config_from_environment(monkeypatch):
    monkeypatch.setenv("CELLFORK_URL", "http://env:9/")
    monkeypatch.setenv("CELLFORK_API_KEY", "envkey")
    cfg = resolve_config()
    assert (cfg.base_url, cfg.api_key) == ("http://env:9", "envkey")
    cfg = resolve_config(base_url="http://kw:1", api_key="kwkey", request_timeout=0)
    assert (cfg.base_url, cfg.api_key, cfg.request_timeout) == ("http://kw:1", "kwkey", None)


def test_config_defaults(monkeypatch):
    monkeypatch.delenv("CELLFORK_URL", raising=False)
    monkeypatch.delenv("CELLFORK_API_KEY", raising=False)
    cfg = resolve_config()
    assert cfg.base_url == DEFAULT_URL and cfg.api_key is None
    assert "X-API-KEY" not in ApiCore(cfg).control_headers()
    with pytest.raises(ValueError):
        resolve_config(request_timeout=-1)


def test_create_request():
    api = ApiCore(resolve_config(base_url="http://d:1", api_key="k"))
    spec = api.create_request("base", 120, {"A": "1"}, {"m": "v"}, None, None)
    assert (spec.method, spec.path) == ("POST", "/v2/sandboxes")
    assert spec.headers["X-API-KEY"] == "k"
    assert spec.json == {"templateID": "base", "timeout": 120, "metadata": {"m": "v"},
                         "envVars": {"A": "1"}}
    assert not spec.idempotent
    snap = api.create_request("base", None, None, None, "snap-1", None)
    assert snap.json == {"templateID": "snap-1", "metadata": {}, "envVars": {}}


def test_create_request_limits():
    api = ApiCore(resolve_config(base_url="http://d:1"))
    spec = api.create_request("base", None, None, None, None, None,
                              Limits(cpu_count=2, memory_mb=512, disk_size_mb=256, pids_max=100, open_files=1000))
    assert spec.json == {"templateID": "base", "metadata": {}, "envVars": {}, "cpuCount": 2, "memoryMB": 512,
                         "diskSizeMB": 256, "pidsMax": 100, "openFiles": 1000}
    # Unset limits are left out (the daemon's defaults apply); zero is sent
    # as is, for the daemon to refuse.
    assert Limits(pids_max=0).to_json() == {"pidsMax": 0}
    assert Limits().to_json() == {}
    for bad in ("2", 2.0, True):
        with pytest.raises(TypeError):
            Limits(cpu_count=bad).to_json()


def test_control_plane_paths_and_policies():
    core = _core()
    info = core.info_request(None)
    assert (info.method, info.path, info.idempotent, info.sandbox_lookup) == (
        "GET", "/sandboxes/sbx1", True, True)
    kill = core.kill_request(None)
    assert (kill.method, kill.path, kill.accept) == ("DELETE", "/sandboxes/sbx1", {404})
    to = core.set_timeout_request(90, 5)
    assert (to.path, to.json, to.timeout.read) == ("/sandboxes/sbx1/timeout", {"timeout": 90}, 5)
    conn = core.connect_request("a/b", None, None)
    assert conn.path == "/v2/sandboxes/a%2Fb/connect" and conn.json == {}
    assert core.connect_request("x", 60, None).json == {"timeout": 60}


def test_list_request_params():
    spec = _core().list_request({"a b": "c&d"}, ["running", "paused"], 10, "tok", None)
    assert spec.idempotent
    req = _render(spec)
    # Quoted, then urlencoded: the E2B SDKs' encoding, unescaped twice by the server.
    assert req.url.params["metadata"] == "a%2520b=c%2526d"
    assert req.url.params["state"] == "running,paused"
    assert req.url.params["limit"] == "10" and req.url.params["nextToken"] == "tok"


def test_data_plane_headers_route_by_sandbox_and_port():
    core = _core()
    for spec, port in [(core.health_request(None), "49983"),
                       (core.exists_request("/x", None, None), "49983"),
                       (core.execute_request("1", None, None, 300, None), "49999"),
                       (core.list_contexts_request(None), "49999")]:
        assert spec.headers["E2b-Sandbox-Id"] == "sbx1"
        assert spec.headers["E2b-Sandbox-Port"] == port
        assert spec.headers["X-Access-Token"] == "tok"
        assert "X-API-KEY" not in spec.headers


def test_unary_rpc_request():
    spec = _core().list_dir_request("/home/user", 1, "root", 7)
    assert spec.path == "/filesystem.Filesystem/ListDir"
    assert spec.json == {"path": "/home/user", "depth": 1}
    assert spec.headers["Content-Type"] == "application/json"
    assert spec.headers["Connect-Protocol-Version"] == "1"
    assert spec.headers["Connect-Timeout-Ms"] == "7000"
    assert spec.headers["Authorization"] == "Basic cm9vdDo="
    assert "Authorization" not in _core().list_dir_request("/", 1, None, None).headers


def test_process_start_is_an_enveloped_stream_request():
    spec = _core().process_start_request("echo hi", {"A": "1"}, "/tmp", "user", 60, None)
    assert spec.path == "/process.Process/Start"
    assert spec.headers["Content-Type"] == "application/connect+json"
    assert spec.headers["Connect-Timeout-Ms"] == "60000"
    assert spec.headers["Keepalive-Ping-Interval"] == "50"
    assert spec.headers["Authorization"] == "Basic " + base64.b64encode(b"user:").decode()
    flags, length = struct.unpack(">BI", spec.content[:5])
    assert flags == 0 and length == len(spec.content) - 5
    assert json.loads(spec.content[5:]) == {
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                    "envs": {"A": "1"}, "cwd": "/tmp"},
        "stdin": False,
    }
    no_deadline = _core().process_start_request("x", None, None, None, None, None)
    assert "Connect-Timeout-Ms" not in no_deadline.headers
    assert json.loads(no_deadline.content[5:])["process"] == {
        "cmd": "/bin/bash", "args": ["-l", "-c", "x"]}


def test_kill_process_and_exists_accept_404():
    core = _core()
    kill = core.kill_process_request(5, None)
    assert kill.json == {"process": {"pid": 5}, "signal": "SIGNAL_SIGKILL"}
    assert kill.accept == {404}
    assert core.exists_request("/p", None, None).accept == {404}
    assert core.make_dir_request("/p", None, None).accept == {409}


def test_file_requests():
    core = _core()
    read = core.read_file_request("/home/user/a.txt", "text", "root", None)
    assert (read.method, read.path, read.params) == (
        "GET", "/files", {"path": "/home/user/a.txt", "username": "root"})
    with pytest.raises(ValueError):
        core.read_file_request("/x", "json", None, None)
    req = _render(core.write_file_request("/home/user/a.txt", "héllo", None, None))
    assert req.url.params["path"] == "/home/user/a.txt"
    assert req.headers["content-type"].startswith("multipart/form-data")
    body = req.read()
    assert b'name="file"; filename="/home/user/a.txt"' in body
    assert "héllo".encode() in body
    raw = _render(core.write_file_request("/b", b"\x00\x01", None, None)).read()
    assert b"application/octet-stream" in raw and b"\x00\x01" in raw
    with pytest.raises(TypeError):
        core.write_file_request("/c", 5, None, None)


def test_execute_request_body_and_timeouts():
    from cellfork import Context

    core = _core()
    spec = core.execute_request("1+1", Context(id="c1"), {"X": "y"}, 300, None)
    assert spec.json == {"code": "1+1", "context_id": "c1", "language": None,
                         "env_vars": {"X": "y"}}
    assert spec.timeout.read == 300 and spec.timeout.connect == 60
    plain = core.execute_request("1", None, None, None, None)
    assert plain.json["context_id"] is None and plain.json["env_vars"] is None
    assert plain.timeout.read is None
    js = core.execute_request("1", None, None, None, None, "js")
    assert js.json["language"] == "js" and js.json["context_id"] is None
    with pytest.raises(InvalidArgumentError):
        core.execute_request("1", Context(id="c1"), None, None, None, "r")


def test_context_requests():
    core = _core()
    assert core.create_context_request("/tmp", None, None).json == {"cwd": "/tmp"}
    rm = core.context_request("DELETE", "c/1", "", None)
    assert (rm.method, rm.path) == ("DELETE", "/contexts/c%2F1")
    rs = core.context_request("POST", "c1", "restart", None)
    assert rs.path == "/contexts/c1/restart"


# --- retry policy ---


def _resp(status, **headers):
    return httpx.Response(status, headers=headers)


GET = RequestSpec("GET", "/x", idempotent=True)
POST = RequestSpec("POST", "/x")


def test_retry_only_idempotent_busy_answers():
    p = RetryPolicy(max_retries=2, rand=lambda: 0.5)
    assert p.retry_after_response(GET, 0, _resp(503)) is not None
    assert p.retry_after_response(GET, 0, _resp(429)) is not None
    assert p.retry_after_response(GET, 0, _resp(500)) is None
    assert p.retry_after_response(POST, 0, _resp(503)) is None
    assert p.retry_after_response(GET, 2, _resp(503)) is None  # attempts exhausted
    # The daemon marks every 503 "Should-Retry: false" for the E2B SDKs'
    # sake; idempotent GETs are still safe to repeat.
    assert p.retry_after_response(GET, 0, _resp(503, **{"Should-Retry": "false"})) is not None


def test_retry_after_is_honoured_with_jitter():
    lo = RetryPolicy(max_retries=3, rand=lambda: 0.0)
    hi = RetryPolicy(max_retries=3, rand=lambda: 0.999)
    for p in (lo, hi):
        d = p.retry_after_response(GET, 0, _resp(429, **{"Retry-After": "2"}))
        assert 2.0 <= d <= 2.2
    assert lo.retry_after_response(GET, 0, _resp(429, **{"Retry-After": "3600"})) is None


def test_backoff_grows_is_capped_and_jittered():
    p = RetryPolicy(max_retries=10, base_delay=0.5, max_delay=4, rand=lambda: 1.0)
    assert [p.delay(a, None) for a in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    q = RetryPolicy(max_retries=10, base_delay=0.5, max_delay=4, rand=lambda: 0.0)
    assert q.delay(0, None) == 0.375


def test_transport_errors_retry_only_before_sending():
    p = RetryPolicy(max_retries=1, rand=lambda: 0.0)
    assert p.retry_after_error(GET, 0, httpx.ConnectError("refused")) is not None
    assert p.retry_after_error(GET, 0, httpx.ReadTimeout("slow")) is None
    assert p.retry_after_error(POST, 0, httpx.ConnectError("refused")) is None
