"""`GET /t/o/<token>` (the open pixel) and `GET /t/c/<token>` (a tracked link).

Neither touches the database: a verified hit is one RPUSH onto the tracking queue (see
delivery/tracking/hits.py) and the answer does not depend on whether that worked. The pixel is
the same 200 image for every token, ours or not, so it is no oracle for valid tokens; a click
token that does not verify is a 404 (there is no URL to send anyone to). No cookie is ever set:
these views read no session and issue no CSRF token.
"""

from __future__ import annotations

import time

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_GET

from delivery.tracking import hits
from delivery.tracking.tokens import InvalidToken, read_click_token, read_open_token

# The smallest transparent GIF: 1×1, one transparent colour (43 bytes).
PIXEL = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
# Every open must reach us (a cached pixel is a lost open) and no shared cache may keep it.
NO_STORE = "no-store, private"


def _client(request: HttpRequest) -> tuple[str, str]:
    # REMOTE_ADDR: behind a reverse proxy, configure it to pass the client address there
    # (gunicorn --forwarded-allow-ips); a client-supplied X-Forwarded-For is not trusted.
    return request.META.get("HTTP_USER_AGENT", ""), request.META.get("REMOTE_ADDR", "")


@require_GET
def open_pixel(request: HttpRequest, token: str) -> HttpResponse:
    try:
        message_id = read_open_token(token)
    except InvalidToken:
        pass
    else:
        agent, ip = _client(request)
        hits.push(
            hits.encode(hits.OPEN, message_id, link=None, url="", user_agent=agent, ip=ip, at=time.time())
        )
    response = HttpResponse(PIXEL, content_type="image/gif")
    response["Cache-Control"] = NO_STORE
    response["Content-Length"] = str(len(PIXEL))
    return response


@require_GET
def click(request: HttpRequest, token: str) -> HttpResponse:
    try:
        target = read_click_token(token)
    except InvalidToken:
        raise Http404("unknown link") from None
    agent, ip = _client(request)
    hits.push(
        hits.encode(
            hits.CLICK,
            target.message_id,
            link=target.link,
            url=target.url,
            user_agent=agent,
            ip=ip,
            at=time.time(),
        )
    )
    response = HttpResponseRedirect(target.url)
    response["Cache-Control"] = NO_STORE
    return response
