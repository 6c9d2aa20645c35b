"""The unsubscribe page at `/u/<token>` (RFC 8058 one-click, RFC 2369 link).

`POST` unsubscribes: mail clients send it (`List-Unsubscribe=One-Click`, form-encoded or
multipart) with no cookie, login or CSRF token, so the view is CSRF-exempt and needs nothing
but the token. The suppression is recorded before the 200 answer and a repeat is harmless.
Never a redirect (RFC 8058 §3.2: the client does not follow one). `GET` only shows a page with
a button that POSTs here, and writes nothing: mail scanners and link previewers fetch every
URL in a message, and a GET that unsubscribed would unsubscribe everyone whose mail is scanned.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from campaigns.exceptions import ExpiredToken, InvalidToken
from campaigns.unsubscribing import Target, target_of, unsubscribe

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="robots" content="noindex">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title></head>
<body style="font-family:sans-serif;max-width:32em;margin:3em auto;padding:0 1em">
<h1 style="font-size:1.4em">{title}</h1>{body}</body></html>"""


def _page(title: str, body: str, status: int = 200) -> HttpResponse:
    response = HttpResponse(format_html(_PAGE, title=title, body=body), status=status)
    # The token is a credential for one address: keep it out of caches and Referer headers.
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex"
    return response


def _masked(address: str) -> str:
    """a•••@example.com: enough for the recipient to recognise, not enough to harvest."""
    local, _, domain = address.partition("@")
    return f"{local[:1]}•••@{domain}"


def _refused(exc: Exception) -> HttpResponse:
    if isinstance(exc, ExpiredToken):
        return _page(
            "This link has expired",
            format_html("<p>{}</p>", "Use the unsubscribe link in a more recent message."),
            status=410,
        )
    return _page(
        "This link is not valid",
        format_html("<p>{}</p>", "Check that the whole link was copied from the message."),
        status=400,
    )


def _confirm(target: Target) -> HttpResponse:
    return _page(
        "Unsubscribe",
        format_html(
            "<p>Stop marketing email to <strong>{}</strong>?</p>"
            '<form method="post"><button type="submit">Unsubscribe</button></form>',
            _masked(target.address),
        ),
    )


@csrf_exempt
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    if request.method == "POST":
        # Read the body first: a malformed multipart body is Django's 400 before anything is written.
        one_click = request.POST.get("List-Unsubscribe") == "One-Click"  # RFC 8058 §3.1's body
        try:
            target, _ = unsubscribe(token, one_click=one_click)
        except (InvalidToken, ExpiredToken) as exc:
            return _refused(exc)
        return _page(
            "You are unsubscribed",
            format_html("<p>{} will receive no more marketing email from us.</p>", _masked(target.address)),
        )
    try:
        target = target_of(token)
    except (InvalidToken, ExpiredToken) as exc:
        return _refused(exc)
    return _confirm(target)
