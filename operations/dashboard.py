"""The operator's dashboard in the admin (/admin/dashboard/ and its JSON, /admin/dashboard/data/).

It reads from every app, so it lives above them, and only through their public selectors:
campaigns scheduled or in flight (`campaigns.selectors.campaigns_in_flight`; one waiting for its
first due instant shows when it sends next, `campaigns.selectors.waiting_until` over
`delivery.selectors.next_sends`, instead of a 0% and a zero rate), the queue snapshot per priority
(`scheduling.selectors.queue_snapshot`, what GET /api/v1/schedules shows), provider circuits and
rate limits (`delivery.selectors.provider_health`, the provider page's data) and the recent
failures and bounces (`delivery.selectors.recent_failures` / `recent_feedback`).

**Send rate and ETA.** A campaign's rate is its finished-message counter (sent + failed +
suppressed + cancelled, kept by campaigns/progress.py) over a recent window: every dashboard
read adds (database now, counter) to a small Redis sorted set per campaign and compares with the
oldest sample of the last RATE_WINDOW_SECONDS. That is one Redis pipeline for all campaigns and
no message scan: counting each campaign's messages sent in the last minute instead reads every
row of the campaign (no index on sent_at, and one would cost every send's update): 47 ms per
100,000 messages measured here, half a second per refresh on a 1M campaign. Until a sample is a
second old (the first view), the rate is the average since the campaign started. ETA = messages
not yet finished / rate. The samples are an index of nothing: losing Redis loses only the rate
for one refresh.

The page renders everything on the server (it works without JavaScript); dashboard.js fetches
the JSON every REFRESH_SECONDS from the same origin and redraws the sections.

**Shared between viewers.** Nearly all of a refresh is the queue snapshot's sequential scan of
delivery_message (296 ms for the whole refresh on 1M messages, 267 of it the snapshot:
docs/performance.md), so a computed refresh is kept in Redis for SHARED_SECONDS, per operator
zone (its display strings are in that zone): any number of open dashboards cost PostgreSQL one
refresh per interval, not one each.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import redis as redis_lib
from django.contrib import admin
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from campaigns.selectors import campaigns_in_flight, waiting_until, waits_for_due_instant
from core import redis_clients
from core.admin import zoned_text
from delivery.selectors import next_sends, provider_health, recent_failures, recent_feedback
from outbound.selectors import troubled_endpoints
from scheduling.selectors import queue_snapshot

REFRESH_SECONDS = 5
SHARED_SECONDS = 4.0  # below REFRESH_SECONDS: each viewer's next poll finds a fresh one
_SHARED_KEY = "emailhub:dashboard:data:{zone}"
RATE_WINDOW_SECONDS = 60.0
RECENT_ROWS = 10
_SAMPLES_KEY = "emailhub:dashboard:finished:{id}"


def _window_samples(now: float, finished: dict[int, int]) -> dict[int, tuple[float, int] | None]:
    """Record (now, finished) for each campaign and return the oldest sample at least one
    second old within the window: one pipeline, whatever the number of campaigns."""
    pipe = redis_clients.pages().pipeline(transaction=False)
    for campaign_id, done in finished.items():
        key = _SAMPLES_KEY.format(id=campaign_id)
        pipe.zremrangebyscore(key, "-inf", now - 2 * RATE_WINDOW_SECONDS)
        pipe.zrangebyscore(key, now - RATE_WINDOW_SECONDS, now - 1.0, start=0, num=1, withscores=True)
        pipe.zadd(key, {f"{now:.3f}:{done}": now})
        pipe.expire(key, int(4 * RATE_WINDOW_SECONDS))
    results = pipe.execute()
    samples: dict[int, tuple[float, int] | None] = {}
    for n, campaign_id in enumerate(finished):
        oldest = results[4 * n + 1]
        if oldest:
            member, score = oldest[0]
            samples[campaign_id] = (float(score), int(member.decode().rsplit(":", 1)[1]))
        else:
            samples[campaign_id] = None
    return samples


def _campaign_rows(now: datetime, campaigns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    epoch = now.timestamp()
    finished = {
        c["id"]: int(c["sent"]) + int(c["failed"]) + int(c["suppressed"]) + int(c["cancelled"])
        for c in campaigns
    }
    try:
        samples = _window_samples(epoch, finished) if campaigns else {}
    except redis_lib.RedisError:
        samples = {}
    # One indexed query for the campaigns that may wait for a due instant (none sent yet).
    dues = next_sends(
        [
            c["id"]
            for c in campaigns
            if waits_for_due_instant(c["status"], c["schedule_type"], finished[c["id"]])
        ]
    )
    rows = []
    for c in campaigns:
        done, total = finished[c["id"]], int(c["total"])
        rate: float | None = None
        rate_basis = None
        sample = samples.get(c["id"])
        next_send = waiting_until(
            status=c["status"],
            schedule_type=c["schedule_type"],
            scheduled_at=c["scheduled_at"],
            finished=done,
            next_due=dues.get(c["id"]),
            now=now,
        )
        if c["status"] == "sending" and next_send is None:
            if sample is not None and epoch > sample[0]:
                rate, rate_basis = max(done - sample[1], 0) / (epoch - sample[0]), "window"
            elif c["started_at"] is not None and epoch > c["started_at"].timestamp():
                rate, rate_basis = done / (epoch - c["started_at"].timestamp()), "since_start"
        remaining = max(total - done, 0)
        eta = remaining / rate if rate else None
        percent = round(100.0 * done / total, 1) if total else 0.0
        rows.append(
            {
                "id": c["id"],
                "name": c["name"],
                "status": c["status"],
                "priority": c["priority"],
                "schedule_type": c["schedule_type"],
                "total": total,
                "sent": int(c["sent"]),
                "failed": int(c["failed"]),
                "suppressed": int(c["suppressed"]),
                "cancelled": int(c["cancelled"]),
                "finished": done,
                "remaining": remaining,
                "percent": percent,
                # Fan-out still creating messages: the total (and so the ETA) is still growing.
                "fanout_done": bool(c["fanout_done"]),
                "rate_per_second": round(rate, 2) if rate is not None else None,
                "rate_basis": rate_basis,
                "eta_seconds": round(eta) if eta is not None else None,
                "eta_display": _duration(eta) if eta is not None else "-",
                # Nothing sent yet and nothing to send before this instant: no rate, no ETA.
                "waiting": next_send is not None,
                "next_send_at": _iso(next_send),
                "next_send_display": zoned_text(next_send) if next_send else None,
                "started_at": _iso(c["started_at"]),
                "started_at_display": zoned_text(c["started_at"]),
                "url": reverse("admin:campaigns_campaign_change", args=[c["id"]]),
            }
        )
    return rows


def _duration(seconds: float) -> str:
    """An ETA for people: "45 s", "12 min", "3 h 05 min"."""
    whole = round(seconds)
    if whole < 90:
        return f"{whole} s"
    if whole < 90 * 60:
        return f"{round(whole / 60)} min"
    hours, minutes = divmod(round(whole / 60), 60)
    return f"{hours} h {minutes:02d} min"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _provider_row(provider: dict[str, Any]) -> dict[str, Any]:
    """The provider's health with when its last error happened, for people."""
    at = provider["circuit"].get("last_error_at")
    when = zoned_text(datetime.fromtimestamp(at, UTC)) if at is not None else None
    return {**provider, "circuit": {**provider["circuit"], "last_error_at_display": when}}


def dashboard_data() -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-ready values."""
    now, campaigns = campaigns_in_flight()
    failures = [
        {
            **{k: v for k, v in f.items() if k != "at"},
            "at": _iso(f["at"]),
            "at_display": zoned_text(f["at"]),
            "url": reverse("admin:delivery_message_change", args=[f["id"]]),
        }
        for f in recent_failures(RECENT_ROWS)
    ]
    feedback = [
        {
            **{k: v for k, v in e.items() if k != "occurred_at"},
            "occurred_at": _iso(e["occurred_at"]),
            "occurred_at_display": zoned_text(e["occurred_at"]),
            "url": reverse("admin:delivery_emailevent_change", args=[e["id"]]),
        }
        for e in recent_feedback(RECENT_ROWS)
    ]
    return {
        "generated_at": _iso(now),
        "generated_at_display": zoned_text(now),
        "refresh_seconds": REFRESH_SECONDS,
        "campaigns": _campaign_rows(now, campaigns),
        "queue": queue_snapshot(),
        "providers": [_provider_row(p) for p in provider_health()],
        "recent_failures": failures,
        "recent_feedback": feedback,
        # Outbound webhook endpoints disabled by what happened (410, failing for days) or failing
        # now: the application is not hearing of its mail.
        "webhook_endpoints": [
            {
                "id": e.pk,
                "url": e.url,
                "enabled": e.enabled,
                "reason": e.disabled_reason,
                "failing_since_display": zoned_text(e.failing_since) if e.failing_since else "",
                "admin_url": reverse("admin:outbound_endpoint_change", args=[e.pk]),
            }
            for e in troubled_endpoints(RECENT_ROWS)
        ],
    }


def shared_dashboard_data() -> dict[str, Any]:
    """dashboard_data(), computed at most once per SHARED_SECONDS per operator zone."""
    if SHARED_SECONDS <= 0:
        return dashboard_data()
    key = _SHARED_KEY.format(zone=timezone.get_current_timezone_name())
    try:
        cached = redis_clients.pages().get(key)
    except redis_lib.RedisError:
        return dashboard_data()
    if cached is not None:
        return cast(dict[str, Any], json.loads(cached))
    data = dashboard_data()
    try:
        redis_clients.pages().set(key, json.dumps(data, cls=DjangoJSONEncoder), px=int(SHARED_SECONDS * 1000))
    except redis_lib.RedisError:
        pass
    return data


def dashboard_view(request: HttpRequest) -> HttpResponse:
    data = shared_dashboard_data()
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "data": data,
        "data_url": reverse("admin-dashboard-data"),
    }
    return TemplateResponse(request, "admin/operations/dashboard.html", context)


def dashboard_data_view(request: HttpRequest) -> JsonResponse:
    response = JsonResponse(shared_dashboard_data())
    response["Cache-Control"] = "no-store"
    return response
