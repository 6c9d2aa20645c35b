"""The client address behind trusted reverse proxies (core/client_ip.py): X-Forwarded-For is read
only when the socket's peer is trusted, right to left, skipping trusted hops; a spoofed header
from anyone else changes nothing.

The places that use the rule are tested where they live: the tracking fast path through gunicorn
(tests/test_tracking_fastpath.py), the tracking views (tests/test_tracking.py), django-axes'
lockout (tests/test_admin_dashboard.py) and the /metrics allow-list (tests/test_metrics.py).
"""

from __future__ import annotations

import ipaddress

import pytest
from django.test import RequestFactory, override_settings
from hypothesis import given
from hypothesis import strategies as st

from core.checks import trusted_proxies_behind_https
from core.client_ip import client_address, networks, request_client_address

TRUSTED = networks(["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "header", "client"),
    [
        # Untrusted peer: the header is the client's own text, ignored whatever it says.
        ("203.0.113.9", "17.58.1.2", "203.0.113.9"),
        ("203.0.113.9", "17.58.1.2, 10.0.0.2", "203.0.113.9"),
        # A trusted peer and one forwarded client.
        ("10.0.0.1", "198.51.100.7", "198.51.100.7"),
        # What the client wrote left of the address our proxy appended is ignored.
        ("10.0.0.1", "17.58.1.2, 198.51.100.7", "198.51.100.7"),
        ("10.0.0.1", "127.0.0.1, 198.51.100.7", "198.51.100.7"),
        # Trusted hops on the way are skipped, right to left.
        ("127.0.0.1", "198.51.100.7, 10.0.0.2, 10.0.0.3", "198.51.100.7"),
        # Only trusted hops: the leftmost is the client (an address on the inside).
        ("10.0.0.1", "10.0.0.9, 10.0.0.2", "10.0.0.9"),
        # Two X-Forwarded-For headers, as the WSGI server joins them (in order, by a comma).
        ("10.0.0.1", "17.58.1.2,198.51.100.7", "198.51.100.7"),
        # Spaces and tabs around entries; empty list elements (RFC 9110 5.6.1) are skipped.
        ("10.0.0.1", " \t198.51.100.7 ,  10.0.0.2\t", "198.51.100.7"),
        ("10.0.0.1", "198.51.100.7,, 10.0.0.2,", "198.51.100.7"),
        # IPv6, bracketed, with ports; IPv4 with a port; written in capitals; IPv4-mapped IPv6.
        ("10.0.0.1", "2001:db8::1", "2001:db8::1"),
        ("10.0.0.1", "[2001:db8::1]:443", "2001:db8::1"),
        ("10.0.0.1", "[2001:DB8::1]", "2001:db8::1"),
        ("10.0.0.1", "198.51.100.7:5678", "198.51.100.7"),
        ("10.0.0.1", "::ffff:198.51.100.7", "198.51.100.7"),
        ("10.0.0.1", "198.51.100.7, [fd00::5]:8080", "198.51.100.7"),
        # A trusted IPv6 peer, and an IPv4-mapped peer in a trusted IPv4 network.
        ("fd00::1", "198.51.100.7", "198.51.100.7"),
        ("::ffff:10.0.0.1", "198.51.100.7", "198.51.100.7"),
        # Garbage stops the walk: the last address read (a trusted hop) is the client.
        ("10.0.0.1", "198.51.100.7, unknown, 10.0.0.2", "10.0.0.2"),
        ("10.0.0.1", "unknown", "10.0.0.1"),
        ("10.0.0.1", "198.51.100.7:http", "10.0.0.1"),
        ("10.0.0.1", "[2001:db8::1]x", "10.0.0.1"),
        ("10.0.0.1", "1.2.3.4:5:6", "10.0.0.1"),
        ("10.0.0.1", "198.51.100.7, " + "1" * 100, "10.0.0.1"),  # too long to be an address
        # ...but garbage left of the client is never reached.
        ("10.0.0.1", "_hidden, <script>, 198.51.100.7", "198.51.100.7"),
        # No header, or an empty one: the peer.
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", " , ", "10.0.0.1"),
        # A peer that is no address (a Unix socket's empty REMOTE_ADDR) is never trusted.
        ("", "198.51.100.7", ""),
    ],
)
def test_client_address_follows_the_trusted_hops_only(peer: str, header: str, client: str) -> None:
    assert client_address(peer, header, TRUSTED) == client


def test_without_trusted_proxies_the_header_is_never_read() -> None:
    for peer in ("10.0.0.1", "127.0.0.1", "203.0.113.9"):
        assert client_address(peer, "17.58.1.2", networks([])) == peer


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address in TRUSTED


def test_each_set_of_trusted_networks_decides_for_itself() -> None:
    # The decisions are cached per (entry, set): a change of setting is a new set.
    header = "10.0.0.9, 10.0.0.5"
    assert client_address("10.0.0.1", header, networks(["10.0.0.0/8"])) == "10.0.0.9"
    assert client_address("10.0.0.1", header, networks(["10.0.0.1/32"])) == "10.0.0.5"
    assert client_address("10.0.0.1", header, networks(["192.0.2.0/24"])) == "10.0.0.1"


untrusted = st.ip_addresses().filter(lambda address: not _trusted(address))
trusted_hops = st.lists(
    st.one_of(
        st.ip_addresses(network="10.0.0.0/8"),
        st.just(ipaddress.ip_address("127.0.0.1")),
        st.ip_addresses(network="fd00::/8"),
    ),
    max_size=4,
)


@given(peer=untrusted, header=st.text(max_size=80))
def test_an_untrusted_peer_is_the_client_whatever_the_header_says(
    peer: ipaddress.IPv4Address | ipaddress.IPv6Address, header: str
) -> None:
    assert client_address(str(peer), header, TRUSTED) == str(peer)


@given(
    spoofed=st.text(max_size=80),
    client=untrusted,
    hops=trusted_hops,
    peer=st.ip_addresses(network="10.0.0.0/8"),
)
def test_nothing_a_client_writes_itself_changes_the_address(
    spoofed: str,
    client: ipaddress.IPv4Address | ipaddress.IPv6Address,
    hops: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    peer: ipaddress.IPv4Address,
) -> None:
    # Through trusted proxies, the header is `<what the client sent>, <client>, <hops…>`: the
    # client's own part (any text, commas and addresses included) is left of what we believe.
    header = ", ".join([spoofed, str(client), *(f"[{h}]:443" if h.version == 6 else str(h) for h in hops)])
    expected = client.ipv4_mapped if client.version == 6 and client.ipv4_mapped else client
    assert client_address(str(peer), header, TRUSTED) == str(expected)


@pytest.mark.django_db
def test_request_client_address_reads_the_setting_at_call_time() -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert request_client_address(request) == "10.0.0.1"  # default: no trusted proxies
    with override_settings(EMAILHUB_TRUSTED_PROXIES=["10.0.0.0/8"]):
        assert request_client_address(request) == "198.51.100.7"


def test_deploy_check_warns_when_served_behind_a_proxy_without_trusting_it() -> None:
    with override_settings(HTTPS=True, EMAILHUB_TRUSTED_PROXIES=[]):
        (warning,) = trusted_proxies_behind_https()
        assert warning.id == "core.W001" and "EMAILHUB_TRUSTED_PROXIES" in warning.msg
    with override_settings(HTTPS=True, EMAILHUB_TRUSTED_PROXIES=["10.0.0.0/8"]):
        assert trusted_proxies_behind_https() == []
    with override_settings(HTTPS=False, EMAILHUB_TRUSTED_PROXIES=[]):
        assert trusted_proxies_behind_https() == []
