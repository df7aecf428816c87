"""Egress policy through our SDK against the real daemon: set at create,
reported by network(), replaced by update_network(), refusals counted.
(What domain rules let through is proven against a fake internet in the Go
integration suite.)"""

import pytest

from cellfork import AsyncSandbox, InvalidArgumentError, Sandbox

pytestmark = pytest.mark.integration

CONNECT = """
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("203.0.113.77", 8080)); print("connected")
except OSError as e:
    print(type(e).__name__)
"""


def test_create_with_an_allow_list(new_sandbox):
    sb = new_sandbox(allow_out=["pypi.org", "*.pythonhosted.org"], deny_out=["0.0.0.0/0"])
    st = sb.network()
    assert (st.allow_out, st.deny_out) == (["pypi.org", "*.pythonhosted.org"], ["0.0.0.0/0"])
    assert sb.run_code(CONNECT).logs.stdout == ["ConnectionRefusedError\n"]
    assert sb.network().denied_connections >= 1
    sb.update_network(allow_internet_access=False)
    st = sb.network()
    assert st.allow_internet_access is False and st.allow_out == [] and st.deny_out == []


def test_bad_rules(client_kwargs, run_tag, no_leaked_sandboxes):
    for kwargs in ({"deny_out": ["example.com"]}, {"allow_out": ["not a host"]}):
        with pytest.raises(InvalidArgumentError) as err:
            Sandbox.create(metadata=run_tag, **kwargs, **client_kwargs)
        assert err.value.status_code == 400
    with pytest.raises(TypeError):
        Sandbox.create(metadata=run_tag, allow_out="example.com", **client_kwargs)


async def test_async_network(client_kwargs, run_tag, no_leaked_sandboxes):
    async with await AsyncSandbox.create(timeout=120, metadata=run_tag, allow_internet_access=False, **client_kwargs) as sb:
        assert (await sb.network()).allow_internet_access is False
        await sb.update_network(allow_out=["10.1.2.3"])
        assert (await sb.network()).allow_out == ["10.1.2.3"]
