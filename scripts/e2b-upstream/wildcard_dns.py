"""pytest plugin for the E2B upstream measurement: resolves every name
under $CELLFORK_WILDCARD_DOMAIN to 127.0.0.1, standing in for the wildcard
DNS record a `--domain` deployment has (docs/setup.md), and trusts the TLS
front's certificate ($CELLFORK_WILDCARD_CA) next to certifi's. Nothing else
is changed. Test harness only."""

import os
import socket

_domain = os.environ.get("CELLFORK_WILDCARD_DOMAIN", "").lower().strip(".")
_real_getaddrinfo = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if _domain and isinstance(name, str) and (name.lower() == _domain or name.lower().endswith("." + _domain)):
        host = "127.0.0.1"
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo

_ca = os.environ.get("CELLFORK_WILDCARD_CA")
if _ca:
    import certifi

    _bundle = os.path.join(os.path.dirname(_ca), "bundle.pem")
    with open(_bundle, "w") as out:
        out.write(open(certifi.where()).read() + "\n" + open(_ca).read())
    certifi.where = lambda: _bundle
    os.environ["SSL_CERT_FILE"] = _bundle
