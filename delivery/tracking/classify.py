"""Who opened or clicked: a person, or something fetching on a person's behalf.

Every hit is kept with its class; only `human` hits count in open and click rates, set a
message's first_opened_at / first_clicked_at and feed send-time optimisation. The rules, in the
order they are tried (the first that matches wins):

1. `machine`: Apple Mail Privacy Protection (iOS 15+/macOS 12+) fetches every remote image of a
   message on delivery, through Apple's proxies, whether or not anyone reads it. Its fetches
   carry the bare user agent `Mozilla/5.0` (nothing after it) and come from Apple's network,
   17.0.0.0/8, Apple's ARIN allocation (NET-17-0-0-0-1; MPP traffic has been observed there by
   Litmus and SendGrid, whose `sg_machine_open` flag marks the same thing). SendGrid's own flag
   (`sg_machine_open: true`) is taken as it is.
2. `proxy`: webmail image proxies (Gmail's GoogleImageProxy via ggpht.com, Yahoo's
   YahooMailProxy, Outlook.com's image proxy). They fetch when a person opens the message, but
   also cache and prefetch, and they hide the reader's address and time zone, so they are kept
   apart rather than counted as a person.
3. `bot`: a user agent on BOT_MARKERS (HTTP libraries, crawlers, link checkers, security
   gateways' fetchers), an empty one, or the bare `Mozilla/5.0` from outside Apple's network (no
   real mail client or browser sends it).
4. `scanner`: a click sooner than EMAILHUB_TRACKING_SCANNER_SECONDS after the message was sent
   (security gateways such as Microsoft Safe Links or Mimecast follow links on arrival), or
   several different links of one message clicked within BURST_SECONDS (a person does not click
   two links in two seconds; a scanner walks all of them).
5. `human`: everything else.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime

HUMAN = "human"
MACHINE = "machine"
PROXY = "proxy"
BOT = "bot"
SCANNER = "scanner"

# Apple's 17.0.0.0/8 (ARIN NET-17-0-0-0-1), where Mail Privacy Protection's fetches come from.
APPLE_NETWORKS = (ipaddress.ip_network("17.0.0.0/8"),)
APPLE_MPP_USER_AGENT = "Mozilla/5.0"

# Substrings (compared lower-case) of webmail image proxies' user agents. Sources: Google's
# "Images in Gmail" announcement (2013, `GoogleImageProxy`, via ggpht.com), Yahoo's help article
# SLN28749 ("YahooMailProxy"), and the user agents email service providers document for
# Outlook.com's proxy.
PROXY_MARKERS = ("googleimageproxy", "ggpht.com", "yahoomailproxy", "outlook-image-proxy", "ms-office-image")

# Substrings (compared lower-case) of automated clients' user agents. Maintained here, by hand:
# HTTP libraries and tools (their default user agents), the generic crawler words that the
# crawler-user-agents project (github.com/monperrus/crawler-user-agents) matches on, link
# checkers, and security gateways that fetch links and images on arrival. Add to it when a new
# fetcher shows up in the `bot`-free human counts.
BOT_MARKERS = (
    "curl/",
    "wget/",
    "python-requests",
    "python-urllib",
    "python-httpx",
    "aiohttp",
    "go-http-client",
    "okhttp",
    "java/",
    "apache-httpclient",
    "libwww-perl",
    "node-fetch",
    "axios/",
    "httpie",
    "headlesschrome",
    "phantomjs",
    "bot",
    "crawler",
    "spider",
    "slurp",
    "linkchecker",
    "link checker",
    "w3c_validator",
    "barracuda",
    "mimecast",
    "proofpoint",
    "safelinks",
    "symantec",
    "trendmicro",
    "forcepoint",
    "scanner",
)

# Two different links of one message clicked this close together: a scanner.
BURST_SECONDS = 2.0


@dataclass(frozen=True)
class Hit:
    """What a classifier may look at for one open or click."""

    kind: str  # "opened" | "clicked"
    user_agent: str = ""
    ip: str = ""
    occurred_at: datetime | None = None
    sent_at: datetime | None = None  # when the message was handed to a provider
    machine_open: bool = False  # SendGrid's sg_machine_open
    burst: bool = False  # another link of the same message was clicked within BURST_SECONDS


def from_apple(ip: str) -> bool:
    try:
        address = ipaddress.ip_address(ip.strip())
    except ValueError:
        return False
    return any(address in network for network in APPLE_NETWORKS)


def classify(hit: Hit, *, scanner_seconds: float) -> str:
    """The class of one hit (see the module docstring for the rules and their sources)."""
    agent = hit.user_agent.strip()
    if hit.machine_open:
        return MACHINE
    if agent == APPLE_MPP_USER_AGENT:
        return MACHINE if from_apple(hit.ip) else BOT
    lowered = agent.lower()
    if any(marker in lowered for marker in PROXY_MARKERS):
        return PROXY
    if not agent or any(marker in lowered for marker in BOT_MARKERS):
        return BOT
    if hit.kind == "clicked":
        if hit.burst:
            return SCANNER
        if hit.sent_at is not None and hit.occurred_at is not None:
            if (hit.occurred_at - hit.sent_at).total_seconds() < scanner_seconds:
                return SCANNER
    return HUMAN


def bursts(clicks: list[tuple[int, int, float]]) -> set[int]:
    """Positions (in `clicks`) of clicks that are part of a burst: `clicks` holds (message id,
    link index, Unix time); a click is in a burst when another link of the same message was
    clicked within BURST_SECONDS of it."""
    by_message: dict[int, list[tuple[float, int, int]]] = {}
    for position, (message_id, link, at) in enumerate(clicks):
        by_message.setdefault(message_id, []).append((at, link, position))
    found: set[int] = set()
    for hits in by_message.values():
        hits.sort()
        for i, (at, link, position) in enumerate(hits):
            for other_at, other_link, other_position in hits[i + 1 :]:
                if other_at - at > BURST_SECONDS:
                    break
                if other_link != link:
                    found.update((position, other_position))
    return found
