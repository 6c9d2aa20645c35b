"""What a tracking hit does: the one implementation of `GET /t/o/<token>` and `GET /t/c/<token>`.

The Django views (delivery/tracking/views.py) and the WSGI fast path in front of Django
(fastpaths/tracking.py, given `HITS`) both call `open_hit` and `click_hit`, so the token check,
the queued entry and the answer cannot drift apart.
"""

from __future__ import annotations

import time

from core import metrics
from delivery.exceptions import InvalidToken
from delivery.tracking import hits
from delivery.tracking.tokens import read_click_token, read_open_token
from fastpaths.tracking import Hits

# The smallest transparent GIF: 1×1, one transparent colour (43 bytes).
PIXEL = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
# Every open must reach us (a cached pixel is a lost open) and no shared cache may keep it.
NO_STORE = "no-store, private"
OPEN_PREFIX = "/t/o/"
CLICK_PREFIX = "/t/c/"


def open_hit(token: str, user_agent: str, ip: str) -> None:
    """Queue the open of a genuine token; an unknown one is ignored (the answer is the same)."""
    try:
        message_id = read_open_token(token)
    except InvalidToken:
        metrics.count_tracking_request("open", "unknown_token")
        return
    queued = hits.push(
        hits.encode(hits.OPEN, message_id, link=None, url="", user_agent=user_agent, ip=ip, at=time.time())
    )
    metrics.count_tracking_request("open", "queued" if queued else "not_queued")


def click_hit(token: str, user_agent: str, ip: str) -> str | None:
    """The URL a genuine click token leads to, its click queued; None for any other token."""
    try:
        target = read_click_token(token)
    except InvalidToken:
        metrics.count_tracking_request("click", "unknown_token")
        return None
    queued = hits.push(
        hits.encode(
            hits.CLICK,
            target.message_id,
            link=target.link,
            url=target.url,
            user_agent=user_agent,
            ip=ip,
            at=time.time(),
        )
    )
    metrics.count_tracking_request("click", "queued" if queued else "not_queued")
    return target.url


# What the WSGI fast path answers, and whom it asks (emailhub/wsgi.py).
HITS = Hits(
    open_prefix=OPEN_PREFIX,
    click_prefix=CLICK_PREFIX,
    open_hit=open_hit,
    click_hit=click_hit,
    pixel=PIXEL,
    cache_control=NO_STORE,
)
