"""Which URLs an endpoint may have, checked at registration and again at every delivery.

An endpoint's URL is the application's word, and the workers that call it sit inside the
operator's network: a URL naming (or resolving to) a loopback, private, link-local, shared or
cloud-metadata address would let an API key make emailhub call into that network (SSRF). So:
https only, and every address the host resolves to must be public. DNS can change between the
check and the call (rebinding), so a delivery resolves, checks, and then connects to the very
address it checked (services.http), never resolving again. Two settings open this for
development and tests: EMAILHUB_WEBHOOKS_ALLOW_HTTP and EMAILHUB_WEBHOOKS_ALLOW_PRIVATE.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from outbound.exceptions import UnsafeUrl

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """Where one request goes: the URL's parts and the checked address to connect to."""

    scheme: str
    host: str  # as written, for the Host header, SNI and the certificate check
    port: int
    path: str  # with its query
    address: str  # the resolved, checked IP address


def _parts(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UnsafeUrl("the URL must start with https://")
    if scheme == "http" and not settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP:
        raise UnsafeUrl("the URL must be https (http is refused: events carry your customers' addresses)")
    if not parts.hostname:
        raise UnsafeUrl("the URL has no host")
    if parts.username or parts.password:
        raise UnsafeUrl("credentials in the URL are refused; authenticate requests by their signature")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80), path


# IPv6 forms that carry an IPv4 address a gateway would reach (NAT64, IPv4-compatible), checked
# as that address; and ranges Python calls global that reach a site (deprecated site-local,
# local-use NAT64).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # IPv4-translated (SIIT)
_NOT_PUBLIC_V6 = (ipaddress.ip_network("fec0::/10"), ipaddress.ip_network("64:ff9b:1::/48"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or address in _TRANSLATED or (address in _COMPATIBLE and int(address) > 0xFFFF):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refused_reason(address: IPAddress) -> str | None:
    """Why a request may not go to `address` (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address):
        if (
            any(address in network for network in _NOT_PUBLIC_V6)
            and not settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE
        ):
            return f"{address} is not a public address"
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            address = embedded
    if address.is_global and not address.is_multicast:
        return None
    if settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE and not (address.is_multicast or address.is_unspecified):
        return None
    kind = (
        "loopback"
        if address.is_loopback
        else "link-local or cloud metadata"
        if address.is_link_local
        else "private"
        if address.is_private
        else "not a public"
    )
    return f"{address} is a {kind} address"


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeUrl(f"{host} does not resolve ({exc})") from None
    # An address with a zone (fe80::1%eth0) is link-local whatever follows the %.
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found))


def check(url: str) -> Target:
    """The URL's target, resolved now, every address checked; raises UnsafeUrl naming the
    problem. The first address is the one to connect to."""
    scheme, host, port, path = _parts(url)
    addresses = _resolve(host, port)
    for address in addresses:
        reason = refused_reason(address)
        if reason is not None:
            named = reason if str(address) == host.strip("[]") else f"{host} resolves to {reason}"
            raise UnsafeUrl(f"{named}; endpoints must be public")
    return Target(scheme, host, port, path, str(addresses[0]))


def check_form(url: str) -> None:
    """What registration checks before resolving: the scheme, the host, no credentials."""
    _parts(url)
