"""The operator's own timezone for the admin: read from a cookie, activated per request.

The admin shows every instant in UTC and in the operator's zone (`core.admin.zoned`). The zone
is a cookie, not a profile row: the admin's frame sets it from the browser's own zone
(`Intl.DateTimeFormat().resolvedOptions().timeZone`, core/static/emailhub/admin.js) the first
time, and the operator can pick another on /admin/timezone/. An unknown or missing name means
UTC only. The middleware reads one cookie and touches nothing else, so it costs an API request
next to nothing, and only admin pages are shown in the operator's zone.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from core.timezones import known_timezones

TIMEZONE_COOKIE = "emailhub_tz"
ADMIN_PREFIX = "/admin/"  # emailhub/urls.py mounts the admin, and its own pages, there


def operator_zone_name(request: HttpRequest) -> str | None:
    """The IANA name the operator chose, or None (UTC only)."""
    name = request.COOKIES.get(TIMEZONE_COOKIE)
    return name if name and name in known_timezones() else None


class OperatorTimezoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The admin only: the API writes instants in UTC whatever cookie a browser sends along
        # (Swagger's "Try it out" runs on the same origin).
        admin = request.path_info.startswith(ADMIN_PREFIX)
        name = operator_zone_name(request) if admin and TIMEZONE_COOKIE in request.COOKIES else None
        if name:
            timezone.activate(zoneinfo.ZoneInfo(name))
        else:
            timezone.deactivate()
        return self.get_response(request)
