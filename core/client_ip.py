"""The client's address of a request: the socket's peer, or, behind reverse proxies we trust, the
address they forwarded in X-Forwarded-For.

One rule, used by everything that records or decides on an address: the tracking fast path
(delivery/tracking/serve.py) and views, django-axes (`AXES_CLIENT_IP_CALLABLE`) and the /metrics
allow-list (core/metrics.py).

1. With no trusted proxies (EMAILHUB_TRUSTED_PROXIES empty, the default), or a peer (REMOTE_ADDR)
   outside them, the address is REMOTE_ADDR and X-Forwarded-For is ignored: anyone can send it.
   A peer that is no address (a Unix socket's empty REMOTE_ADDR) is never trusted.
2. From a trusted peer the header is read right to left. Each proxy appends the address it got
   the request from, so the right end was written by our proxies and anything left of the first
   address they did not write may be the client's own invention. Trusted hops are skipped; the
   first address outside the trusted networks is the client.
3. A header of trusted hops only: the leftmost is the client (a machine on the inside).
4. An entry that is no address (`unknown`, RFC 7239's obfuscated `_name`, garbage, anything
   over MAX_ENTRY_CHARS) stops the walk: the last address read, the trusted hop that forwarded that entry, is the client. Nothing
   left of it can be believed, and that hop is the last party we know.
5. Entries may carry spaces, a port (`1.2.3.4:5678`), brackets (`[2001:db8::1]:443`); an
   IPv4-mapped IPv6 address is its IPv4 address; empty list elements are skipped (RFC 9110
   5.6.1). Several X-Forwarded-For headers reach the application as one value, joined in order
   with commas by the WSGI server (gunicorn; RFC 9110 5.3 makes them one list).

Why not django-ipware (python-ipware), which django-axes would use: its proxy list is one entry
per hop, matched in order against the header's last entries, and the socket's peer is never
checked, so a client reaching the web process directly can write the whole chain itself.

Cost on the open pixel's fast path (timeit, docs/performance.md): ~0.1 µs with no trusted
proxies or no header; from a trusted peer 0.8 µs for an address seen before (each entry's
decision is cached) and ~6 µs for a new one, against ~120-230 µs for the whole hit in-process.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The longest entry read as an address: `[<IPv6, 45 characters>%<zone>]:65535` fits. Longer is
# garbage (rule 4), never parsed nor cached.
MAX_ENTRY_CHARS = 80


class NetworkSet:
    """Networks an address is tested against (`address in networks`). Hashed by identity, so the
    decisions below can be cached per (entry, set): an ipaddress network's own hash costs ~1 µs."""

    __slots__ = ("networks",)

    def __init__(self, networks: Iterable[Network]) -> None:
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, address: Address) -> bool:
        return any(address in network for network in self.networks)  # False across IP versions


def networks(cidrs: Iterable[str]) -> NetworkSet:
    """CIDRs (a setting read by emailhub.env.env_networks) as a NetworkSet, each list parsed once
    (the same object for the same list)."""
    return _parsed(tuple(cidrs))


@lru_cache(maxsize=8)
def _parsed(cidrs: tuple[str, ...]) -> NetworkSet:
    return NetworkSet(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def parse_address(text: str) -> Address | None:
    """An address as a header or REMOTE_ADDR writes it (see rule 5), or None for anything else."""
    text = text.strip()
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        if text.startswith("["):  # [IPv6] or [IPv6]:port
            inside, _, port = text[1:].partition("]")
            if port and not (port[0] == ":" and port[1:].isdigit()):
                return None
            text = inside
        elif text.count(":") == 1:  # IPv4:port
            text, _, port = text.partition(":")
            if not port.isdigit():
                return None
        else:
            return None
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# Parsing an address and testing it is ~5 µs; the peers are a few proxies and many hits come from
# a few image proxies' addresses (Apple's, Google's), so the answers are kept, boundedly.
@lru_cache(maxsize=4096)
def _hop(entry: str, trusted: NetworkSet) -> tuple[str, bool] | None:
    """An entry read: its address in normal form and whether it is trusted; None for garbage."""
    address = parse_address(entry) if len(entry) <= MAX_ENTRY_CHARS else None
    return None if address is None else (str(address), address in trusted)


def client_address(remote_addr: str, forwarded_for: str, trusted: NetworkSet) -> str:
    """The client's address (see the module docstring): REMOTE_ADDR as given, or, from a trusted
    peer, the address the header's walk ends on, written in its normal form."""
    if not trusted or not forwarded_for:
        return remote_addr
    peer = _hop(remote_addr, trusted)
    if peer is None or not peer[1]:
        return remote_addr
    client = peer[0]
    for entry in reversed(forwarded_for.split(",")):
        entry = entry.strip()
        if not entry:
            continue
        hop = _hop(entry, trusted)
        if hop is None:
            break
        client, hop_trusted = hop
        if not hop_trusted:
            break
    return client


def request_client_address(request: HttpRequest) -> str:
    """The client's address of a Django request; also django-axes' AXES_CLIENT_IP_CALLABLE.
    EMAILHUB_TRUSTED_PROXIES is read at call time (an attribute; `networks` parses it once)."""
    meta = request.META
    trusted = networks(settings.EMAILHUB_TRUSTED_PROXIES)
    return client_address(meta.get("REMOTE_ADDR", ""), meta.get("HTTP_X_FORWARDED_FOR", ""), trusted)
