"""Egress policy through the official SDK: network= at create (addresses,
domain names, ALL_TRAFFIC), update_network, and what get_info reports.
What the rules let through is proven against a fake internet in the Go
integration suite (test/integration/network_test.go); here the daemon has
no test hosts, so only refusals are checked from inside."""

from __future__ import annotations

import pytest

from e2b import ALL_TRAFFIC, InvalidArgumentException, Sandbox, SandboxException

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
