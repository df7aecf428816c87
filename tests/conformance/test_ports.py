"""User ports through the daemon's data plane: get_host(port) and a web
server started in the sandbox, reached with the E2B routing headers (spec
§1.3, §1.4, §4.7)."""

from __future__ import annotations

import os

import httpx
import pytest

from e2b import Sandbox, SandboxNotFoundException, SandboxNotRunningException, TimeoutException
from e2b_code_interpreter import Sandbox as CodeInterpreterSandbox

from ._util import routing_headers, wait_until

pytestmark = pytest.mark.timeout(60)

PORT = 8080


@pytest.fixture(scope="module")
def web(module_sandbox_factory):
    """A sandbox serving /home/user over `python3 -m http.server 8080`."""
    sbx = module_sandbox_factory()
    sbx.files.write("/home/user/www/index.html", "<h1>hello from the sandbox</h1>")
    sbx.files.write("/home/user/www/files/data.txt", "plain data")
    # `python`, as E2B's tests run it (the base template has both).
    handle = sbx.commands.run(f"python -m http.server {PORT}", cwd="www", background=True)
    return sbx, handle


def _get(base: str, sandbox_id: str, port: int, path: str = "/") -> httpx.Response:
    return httpx.get(f"{base}{path}", headers=routing_headers(sandbox_id, port), timeout=10)


def _daemon_domain(sandbox_url: str) -> str:
    """The domain a daemon without --domain reports: the address it was
    reached at, a loopback address as localhost."""
    url = httpx.URL(sandbox_url)
    host = "localhost" if url.host in ("127.0.0.1", "::1", "localhost") else url.host
    return f"{host}:{url.port}" if url.port else host


def test_get_host_format(web, sandbox_url):
    # create, get and connect answer the domain the daemon serves, so that
    # get_host names this daemon (never E2B's default domain).
    sbx, _ = web
    domain = _daemon_domain(sandbox_url)
    assert sbx.sandbox_domain == domain
    assert sbx.get_host(PORT) == f"{PORT}-{sbx.sandbox_id}.{domain}"
    assert Sandbox.connect(sbx.sandbox_id).get_host(PORT) == f"{PORT}-{sbx.sandbox_id}.{domain}"
    info = httpx.get(f"{sandbox_url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
    assert info.json()["domain"] == domain


def test_user_web_server_through_routing_headers(web, sandbox_url):
    sbx, handle = web
    r = wait_until(
        lambda: (resp := _get(sandbox_url, sbx.sandbox_id, PORT, "/index.html")).status_code == 200 and resp,
        timeout=20, interval=0.25, what="the sandbox web server to answer through the daemon",
    )
    assert r.text == "<h1>hello from the sandbox</h1>"
    # Other paths go through the same route: a directory listing and a file.
    listing = _get(sandbox_url, sbx.sandbox_id, PORT, "/files/")
    assert listing.status_code == 200
    assert "data.txt" in listing.text
    data = _get(sandbox_url, sbx.sandbox_id, PORT, "/files/data.txt")
    assert data.status_code == 200 and data.text == "plain data"
    assert handle.pid in [p.pid for p in sbx.commands.list()]


def test_user_web_server_through_host_form(web, sandbox_url):
    # The Host form "{port}-{sandboxID}.{domain}" that get_host() returns
    # (spec §1.4: a server should also accept it).
    sbx, _ = web
    host = sbx.get_host(PORT)
    wait_until(lambda: _get(sandbox_url, sbx.sandbox_id, PORT).status_code == 200, timeout=20,
               what="the web server")
    r = httpx.get(f"{sandbox_url}/index.html", headers={"Host": host}, timeout=10)
    assert r.status_code == 200
    assert r.text == "<h1>hello from the sandbox</h1>"


def test_closed_port_is_502_port_not_open(web, sandbox_url):
    sbx, _ = web
    r = _get(sandbox_url, sbx.sandbox_id, 8099)
    assert r.status_code == 502
    body = r.json()
    assert "port is not open" in body["message"]
    assert body.get("code") == 502


def test_unknown_sandbox_is_502_not_found(e2b_env, sandbox_url):
    r = _get(sandbox_url, "cfnosuchsandbox0000", PORT)
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]


def test_killed_sandbox_is_502_with_e2bs_words(make_sandbox, sandbox_url):
    # E2B's edge answers a killed sandbox's port with exactly this message
    # (E2B's js-sdk host test compares it), by header and by Host.
    sbx = make_sandbox()
    host = sbx.get_host(PORT)
    sbx.kill()
    r = _get(sandbox_url, sbx.sandbox_id, PORT)
    assert r.status_code == 502
    assert r.json()["message"] == "The sandbox was not found"
    assert r.json()["sandboxId"] == sbx.sandbox_id
    r = httpx.get(sandbox_url, headers={"Host": host}, timeout=10)
    assert r.status_code == 502 and r.json()["message"] == "The sandbox was not found"


def test_private_ports_want_the_traffic_token(make_sandbox, sandbox_url):
    sbx = make_sandbox(network={"allow_public_traffic": False})
    sbx.commands.run(f"python3 -m http.server {PORT}", background=True)
    host = {"Host": sbx.get_host(PORT)}
    token = {"e2b-traffic-access-token": sbx.traffic_access_token}
    wait_until(lambda: httpx.get(sandbox_url, headers={**host, **token}, timeout=10).status_code == 200,
               timeout=20, what="the private server with its token")
    r = httpx.get(sandbox_url, headers=host, timeout=10)
    assert r.status_code == 403 and "traffic access token" in r.json()["message"]
    r = httpx.get(sandbox_url, headers={**host, "e2b-traffic-access-token": "wrong"}, timeout=10)
    assert r.status_code == 403


def test_sdk_maps_proxy_answers(make_sandbox):
    # The SDK keys on the proxy messages (spec §4.7): a killed sandbox is
    # "not running" for envd calls, and the code interpreter's 502 is a
    # TimeoutException (spec §5).
    sbx = make_sandbox(CodeInterpreterSandbox)
    assert sbx.run_code("1").text == "1"
    assert sbx.kill() is True
    assert sbx.is_running() is False
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("echo hi")
    with pytest.raises(SandboxNotRunningException):
        sbx.files.read("/etc/hostname")
    with pytest.raises(SandboxNotRunningException):
        sbx.files.list("/")
    with pytest.raises(TimeoutException):
        sbx.run_code("1")
    with pytest.raises(SandboxNotFoundException):
        CodeInterpreterSandbox.connect(sbx.sandbox_id)
