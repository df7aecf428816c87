"""Egress policy through the official SDK: network= at create (addresses,
domain names, ALL_TRAFFIC), update_network, and what get_info reports;
network rules (header transforms) and mask_request_host. What the rules
let through, and the headers a ruled host receives, are proven against a
fake internet in the Go integration suite (test/integration/network_test.go,
rules_test.go); here the daemon has no test hosts, so only refusals and what
the sandbox itself holds are checked from inside."""

from __future__ import annotations

import httpx
import pytest

from e2b import ALL_TRAFFIC, InvalidArgumentException, Sandbox, SandboxException

from ._util import routing_headers, wait_until

pytestmark = pytest.mark.timeout(60)

RESOLVE = """
import socket, time
t0 = time.time()
try:
    socket.gethostbyname({name!r}); print("resolved")
except OSError as e:
    print(type(e).__name__, round(time.time() - t0, 1))
"""


def _resolve(sbx, name: str) -> str:
    sbx.files.write("/tmp/resolve.py", RESOLVE.format(name=name))
    return sbx.commands.run("python3 /tmp/resolve.py").stdout.strip()


def test_domain_allow_list(make_sandbox):
    sbx = make_sandbox(network={"allow_out": ["pypi.org", "*.pythonhosted.org", "1.1.1.1"], "deny_out": [ALL_TRAFFIC]})
    net = sbx.get_info().network
    assert net is not None
    assert net["allow_out"] == ["pypi.org", "*.pythonhosted.org", "1.1.1.1"]
    assert net["deny_out"] == [ALL_TRAFFIC]
    # A name no rule allows does not resolve, and fails at once.
    out = _resolve(sbx, "example.com")
    assert out.startswith("gaierror"), out
    assert float(out.split()[1]) < 2, out


def test_selector_callable_and_update(make_sandbox):
    sbx = make_sandbox(network={"allow_out": ["api.example.com"], "deny_out": lambda ctx: [ctx.all_traffic]})
    assert sbx.get_info().network["allow_out"] == ["api.example.com"]
    sbx.update_network({"allow_out": ["*.example.org"], "deny_out": [ALL_TRAFFIC], "dns_servers": ["1.1.1.1"]})
    net = sbx.get_info().network
    assert net["allow_out"] == ["*.example.org"]
    assert net["dns_servers"] == ["1.1.1.1"]
    sbx.update_network({})
    net = sbx.get_info().network
    assert net["allow_out"] == [] and net["deny_out"] == []


def test_internet_off_resolves_nothing(make_sandbox):
    sbx = make_sandbox(allow_internet_access=False)
    out = _resolve(sbx, "example.com")
    assert out.startswith("gaierror"), out


@pytest.mark.parametrize("network", [
    {"deny_out": ["example.com"]},  # domains can only be allowed, as in E2B
    {"allow_out": ["not a host"]},
    {"allow_out": ["2001:db8::/32"]},
])
def test_bad_rules_are_refused(make_sandbox, network):
    with pytest.raises((InvalidArgumentException, SandboxException)) as e:
        make_sandbox(network=network)
    assert "400" in str(e.value) or isinstance(e.value, InvalidArgumentException)


SECRET = "Bearer sk-conformance-5e1d0c7b9a"
REDACTED = "[redacted]"


def _rules(value: str = SECRET) -> dict:
    return {
        "api.example.com": [{"transform": {"headers": {"Authorization": value, "X-Team": "t"}}}],
        "*.example.org": [{"transform": {"headers": {"X-Wild": "w"}}}],
    }


def _assert_secret_absent(sbx) -> None:
    """Not in the environment of the sandbox's processes nor in its files
    (the grep pattern ends in "." so that its own arguments are not the
    secret)."""
    env = sbx.commands.run("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'").stdout
    assert SECRET not in env
    files = sbx.commands.run(
        f"grep -rIl -e '{SECRET[:-1]}.' /etc /home /root /tmp /run /var /usr/local /opt 2>/dev/null; true",
        user="root",
    ).stdout
    assert files.strip() == "", files


def test_rules_at_create(make_sandbox):
    sbx = make_sandbox(network={"rules": _rules()})
    # Reported by domain and header name, every value redacted.
    assert sbx.get_info().network["rules"] == {
        "api.example.com": [{"transform": {"headers": {"Authorization": REDACTED, "X-Team": REDACTED}}}],
        "*.example.org": [{"transform": {"headers": {"X-Wild": REDACTED}}}],
    }
    # The sandbox trusts the daemon's egress CA (once), and its processes
    # are pointed at the bundle; the header values are nowhere inside.
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    assert sbx.commands.run(f"grep -c 'cellfork egress CA' {bundle}").stdout.strip() == "1"
    env = sbx.commands.run("env").stdout
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        assert f"{var}={bundle}" in env, env
    assert "NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/cellfork-egress-ca.crt" in env
    _assert_secret_absent(sbx)


def test_rules_by_update(make_sandbox):
    sbx = make_sandbox()
    assert "rules" not in (sbx.get_info().network or {})
    sbx.update_network({"rules": {"api.example.com": [{"transform": {"headers": {"Authorization": SECRET}}}]}})
    info = sbx.get_info().network
    assert info["rules"] == {"api.example.com": [{"transform": {"headers": {"Authorization": REDACTED}}}]}
    assert sbx.commands.run("grep -c 'cellfork egress CA' /etc/ssl/certs/ca-certificates.crt").stdout.strip() == "1"
    _assert_secret_absent(sbx)
    # The update replaces the policy: {} clears the rules.
    sbx.update_network({})
    assert "rules" not in sbx.get_info().network


@pytest.mark.parametrize("rules", [
    # E2B's secret store and workload identity: cellfork has neither.
    {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.OPENAI_KEY}"}}}]},
    {"api.example.com": [{"transform": {"headers": {"Authorization": "${e2b.identity.tokens.aws}"}}}]},
    # The redaction marker get_info reports, sent back.
    {"api.example.com": [{"transform": {"headers": {"Authorization": REDACTED}}}]},
    {"api.example.com": [{}, {}]},  # at most one rule per domain, as in E2B
    {"not a domain": []},
    {"api.example.com": [{"transform": {"headers": {"Content-Length": "1"}}}]},
])
def test_bad_transform_rules_are_refused(make_sandbox, rules):
    with pytest.raises((InvalidArgumentException, SandboxException)) as e:
        make_sandbox(network={"rules": rules})
    assert "400" in str(e.value) or isinstance(e.value, InvalidArgumentException)


MASK = "${PORT}-masked.example.com"
HOST_SERVER = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Host", "") + "|" + self.headers.get("X-Forwarded-Host", "")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""


def test_mask_request_host(make_sandbox, sandbox_url):
    sbx = make_sandbox(network={"mask_request_host": MASK})
    assert sbx.get_info().network["mask_request_host"] == MASK
    sbx.files.write("/tmp/host.py", HOST_SERVER)
    sbx.commands.run("python3 /tmp/host.py", background=True)
    r = wait_until(
        lambda: (resp := httpx.get(sandbox_url, headers=routing_headers(sbx.sandbox_id, 8000), timeout=10)).status_code == 200 and resp,
        timeout=20, what="the server in the sandbox",
    )
    host, forwarded = r.text.split("|")
    assert host == "8000-masked.example.com"
    assert forwarded == httpx.URL(sandbox_url).netloc.decode()
    # Ingress is the create's: an update keeps the mask.
    sbx.update_network({})
    assert sbx.get_info().network["mask_request_host"] == MASK


@pytest.mark.parametrize("mask", ["has space.example.com", "a.example.com/path", "bücher.example"])
def test_bad_mask_is_refused(make_sandbox, mask):
    with pytest.raises((InvalidArgumentException, SandboxException)) as e:
        make_sandbox(network={"mask_request_host": mask})
    assert "400" in str(e.value) or isinstance(e.value, InvalidArgumentException)
