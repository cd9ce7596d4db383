"""The proxy for a request, chosen from the environment as curl chooses it: ``HTTPS_PROXY`` for https:// URLs,
``HTTP_PROXY`` for http:// ones, ``ALL_PROXY`` for both (lower-case names too), none for a host ``NO_PROXY``
names."""

from __future__ import annotations

import contextlib
import ipaddress
import urllib.parse
from collections.abc import Mapping


def proxy_for(endpoint: str, env: Mapping[str, str]) -> str | None:
    """The proxy for requests to ``endpoint`` (a URL), as curl picks one from the environment."""
    parts = urllib.parse.urlsplit(endpoint)
    if _bypasses_proxy(parts.hostname or "", env.get("NO_PROXY") or env.get("no_proxy") or ""):
        return None
    scheme = "HTTPS" if parts.scheme == "https" else "HTTP"
    for name in (f"{scheme}_PROXY", f"{scheme.lower()}_proxy", "ALL_PROXY", "all_proxy"):
        if env.get(name):
            proxy = env[name]
            # curl's habit: a proxy without a scheme is an HTTP proxy.
            return proxy if "://" in proxy else f"http://{proxy}"
    return None


def _bypasses_proxy(host: str, no_proxy: str) -> bool:
    """curl's NO_PROXY: ``*``, a host name and its subdomains (a leading dot or not), an address, a CIDR block."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    for entry in (item.strip().lower() for item in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(entry.strip("[]"), strict=False):
                    return True
            continue
        name = entry.lstrip(".")
        if host.lower() == name or host.lower().endswith("." + name):
            return True
    return False
