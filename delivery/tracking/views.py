"""`GET /t/o/<token>` (the open pixel) and `GET /t/c/<token>` (a tracked link).

Neither touches the database: a verified hit is one RPUSH onto the tracking queue (see
delivery/tracking/hits.py) and the answer does not depend on whether that worked. The pixel is
the same 200 image for every token, ours or not, so it is no oracle for valid tokens; a click
token that does not verify is a 404 (there is no URL to send anyone to). No cookie is ever set:
these views read no session and issue no CSRF token.

In the web process most hits never reach these views: emailhub/wsgi.py answers them with
`TrackingFastPath` (delivery/tracking/serve.py), which calls the same `open_hit` / `click_hit`.
They serve what the fast path passes on (a forged click's 404) and Django's test client.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_GET

from core.client_ip import request_client_address
from delivery.tracking.serve import NO_STORE, PIXEL, click_hit, open_hit


def _client(request: HttpRequest) -> tuple[str, str]:
    # The address: the socket's peer, or behind EMAILHUB_TRUSTED_PROXIES the client's.
    return request.META.get("HTTP_USER_AGENT", ""), request_client_address(request)


@require_GET
def open_pixel(request: HttpRequest, token: str) -> HttpResponse:
    open_hit(token, *_client(request))
    response = HttpResponse(PIXEL, content_type="image/gif")
    response["Cache-Control"] = NO_STORE
    response["Content-Length"] = str(len(PIXEL))
    return response


@require_GET
def click(request: HttpRequest, token: str) -> HttpResponse:
    url = click_hit(token, *_client(request))
    if url is None:
        raise Http404("unknown link")
    response = HttpResponseRedirect(url)
    response["Cache-Control"] = NO_STORE
    return response
