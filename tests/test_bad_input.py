"""Bad input anywhere under /api/ is a 4xx in one JSON shape, naming the field or the limit, and
writes nothing (issue 8, items 7-11)."""

from __future__ import annotations

import json
from datetime import timedelta
from email import message_from_bytes, policy
from email.header import decode_header, make_header
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.test import APIClient
from rest_framework.views import APIView

from campaigns.models import Campaign, Contact, Template
from core.models import OutboxTask
from delivery.models import Message
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from emailhub.urls import urlpatterns as real_urlpatterns
from scheduling.models import RecurringSchedule
from tests.factories import make_audience, make_campaign

VALID = {"to": "ann@example.com", "subject": "Your code", "text": "123456"}


class _Boom(APIView):
    def get(self, request: Request) -> HttpResponse:
        raise RuntimeError("a bug in a view")


def _plain_boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug outside DRF")


# ROOT_URLCONF for the tests that need a view with a bug: the real routes plus two that raise.
urlpatterns = [
    path("api/v1/test-boom", _Boom.as_view()),
    path("api/v1/test-plain-boom", _plain_boom),
    *real_urlpatterns,
]


def error_of(response: Any, status: int) -> dict[str, Any]:
    """The error object of a response in the documented shape (and nothing else at the top)."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"status", "code", "message", "fields"} <= set(error), error
    assert error["status"] == status and isinstance(error["message"], str) and error["message"]
    return error


def nothing_written() -> None:
    assert Message.objects.count() == 0
    assert OutboxTask.objects.count() == 0
    assert Contact.objects.count() == 0
    assert Template.objects.count() == 0


def post_json(api: APIClient, url: str, raw: str | bytes, **extra: Any) -> Any:
    return api.generic("POST", url, raw, content_type="application/json", **extra)


# --- item 7: what PostgreSQL cannot store ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/messages", {**VALID, "context": {"code": "12\u00003"}}, "context"),
        ("/api/v1/messages", {**VALID, "context": {"co\u0000de": "123"}}, "context"),
        ("/api/v1/messages", {**VALID, "context": {"items": [{"n": "\ud800"}]}}, "context"),
        ("/api/v1/messages", {**VALID, "subject": "Your\u0000code"}, "subject"),
        ("/api/v1/messages", {**VALID, "to\u0000": "x"}, "(body)"),
        (
            "/api/v1/contacts",
            {"email": "ann@example.com", "attributes": {"plan": "go\u0000ld"}},
            "attributes",
        ),
        ("/api/v1/contacts", {"email": "ann@example.com", "attributes": {"\u0000": 1}}, "attributes"),
        ("/api/v1/contacts", {"email": "ann@example.com", "name": "A\u0000nn"}, "name"),
        (
            "/api/v1/templates",
            {"name": "t", "subject": "s", "text": "x", "defaults": {"a": "\u0000"}},
            "defaults",
        ),
    ],
)
def test_nul_or_surrogate_in_any_json_string_or_key_is_a_400_naming_the_field(
    api: APIClient, url: str, body: dict[str, Any], field: str
) -> None:
    # json.dumps writes NUL as \u0000 and a lone surrogate as \ud800, as a client would send them.
    error = error_of(post_json(api, url, json.dumps(body)), 400)
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    nothing_written()


def test_nul_in_a_query_parameter_is_a_400_naming_it(api: APIClient) -> None:
    error = error_of(api.get("/api/v1/contacts", {"email": "a\x00@example.com"}), 400)
    assert "email" in error["fields"]


def test_nul_in_a_header_that_is_stored_is_a_400_naming_it(api: APIClient) -> None:
    response = api.post("/api/v1/messages", VALID, format="json", HTTP_IDEMPOTENCY_KEY="k\x001")
    assert "Idempotency-Key" in error_of(response, 400)["fields"]
    nothing_written()


def test_nul_in_an_admin_list_filter_is_a_400_not_a_500(admin_client: Client) -> None:
    response = admin_client.get("/admin/campaigns/contact/", {"status": "\x00"})
    assert response.status_code == 400 and b"U+0000" in response.content


@pytest.fixture
def admin_client(db) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.mark.parametrize(
    ("url", "form", "field"),
    [
        (
            "/admin/campaigns/contact/add/",
            {
                "email": "ann@example.com",
                "name": "Ann",
                "timezone": "UTC",
                "status": "active",
                "attributes": '{"plan": "go\\u0000ld"}',
            },
            "attributes",
        ),  # fmt: skip
        (
            "/admin/campaigns/template/add/",
            {"name": "t", "subject": "s", "html": "", "text": "x", "defaults": '{"\\ud800": "x"}'},
            "defaults",
        ),
        (
            "/admin/campaigns/template/add/",
            {"name": "t", "subject": "s", "html": "", "text": "x\x00y", "defaults": "{}"},
            "text",
        ),
    ],
)
def test_admin_forms_refuse_what_postgresql_cannot_store_with_a_form_error(
    admin_client: Client, url: str, form: dict[str, str], field: str
) -> None:
    response = admin_client.post(url, form)
    assert response.status_code == 200  # the form again, with its errors; not a 500
    assert field in response.context["adminform"].form.errors
    nothing_written()


# --- item 8: depth --------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/api/v1/messages", "/api/v1/contacts", "/api/v1/campaigns"])
def test_a_3000_level_body_is_a_400_naming_the_depth_limit(api: APIClient, url: str) -> None:
    deep = '{"to": "ann@example.com", "context": ' + '{"a": ' * 3000 + "1" + "}" * 3001
    error = error_of(post_json(api, url, deep), 400)
    assert error["limit"] == {"name": "EMAILHUB_API_MAX_JSON_DEPTH", "value": 32}
    deep_list = "[" * 3000 + "]" * 3000
    assert error_of(post_json(api, url, deep_list), 400)["limit"]["name"] == "EMAILHUB_API_MAX_JSON_DEPTH"
    nothing_written()


def test_depth_is_counted_outside_strings_and_up_to_the_setting(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_API_MAX_JSON_DEPTH = 4
    brackets_in_a_string = {**VALID, "text": "[[[[[[{{{{{{"}
    assert post_json(api, "/api/v1/messages", json.dumps(brackets_in_a_string)).status_code == 202
    at_limit = {**VALID, "context": {"a": {"b": {"c": 1}}}}  # 4 levels with the body
    assert post_json(api, "/api/v1/messages", json.dumps(at_limit)).status_code == 202
    over = {**VALID, "context": {"a": {"b": {"c": [1]}}}}
    assert error_of(post_json(api, "/api/v1/messages", json.dumps(over)), 400)["limit"]["value"] == 4
    assert Message.objects.count() == 2


# --- item 9: size, media type, encoding, paths, methods, every status -------------------------


def test_an_oversized_body_is_a_413_naming_the_limit(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_API_MAX_BODY_BYTES = 4096
    body = json.dumps({**VALID, "text": "x" * 5000})
    error = error_of(post_json(api, "/api/v1/messages", body), 413)
    assert error["code"] == "request_too_large"
    assert error["limit"] == {"name": "EMAILHUB_API_MAX_BODY_BYTES", "value": 4096}
    nothing_written()


def test_oversized_form_data_is_a_413_not_djangos_html_page(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = api.post("/api/v1/contacts/import", {"list": "x" * 5000}, format="multipart")
    error = error_of(response, 413)
    assert error["limit"] == {"name": "DATA_UPLOAD_MAX_MEMORY_SIZE", "value": 2048}
    nothing_written()


def test_a_wrong_content_type_is_a_415(api: APIClient) -> None:
    response = api.generic("POST", "/api/v1/messages", "to=ann@example.com", content_type="text/plain")
    assert error_of(response, 415)["code"] == "unsupported_media_type"
    nothing_written()


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"to": "ann@example.com", "subject": "caf\xe9", "text": "x"}',  # Latin-1, not UTF-8
        b'{"to": "ann@example.com", "subject": "s", "text": "x", "context": {"n": NaN}}',
        b'{"to": "ann@example.com", "subject": "s", "text": "x", "context": {"n": 1e999}}',
    ],
)
def test_malformed_json_or_wrong_encoding_is_a_400_parse_error(api: APIClient, raw: bytes) -> None:
    assert error_of(post_json(api, "/api/v1/messages", raw), 400)["code"] == "parse_error"
    nothing_written()


def test_unknown_api_path_is_a_json_404_and_a_wrong_method_a_json_405(api: APIClient) -> None:
    assert error_of(api.get("/api/v1/no-such-thing"), 404)["code"] == "not_found"
    assert error_of(api.get("/api/v1/messages/999999"), 404)["code"] == "not_found"
    error = error_of(api.delete("/api/v1/messages"), 405)
    assert error["code"] == "method_not_allowed"
    # Outside /api/ Django's own pages stay.
    assert not api.get("/no-such-page").get("Content-Type", "").startswith("application/json")


def test_401_409_and_422_are_in_the_same_shape(api: APIClient) -> None:
    assert error_of(APIClient().post("/api/v1/messages", VALID, format="json"), 401)["fields"] == {}
    campaign = make_campaign(make_audience(1))
    assert api.post(f"/api/v1/campaigns/{campaign.pk}/cancel").status_code == 200
    assert "cancelled" in error_of(api.post(f"/api/v1/campaigns/{campaign.pk}/cancel"), 409)["message"]
    assert api.post("/api/v1/messages", VALID, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 202
    other = {**VALID, "text": "different"}
    error = error_of(api.post("/api/v1/messages", other, format="json", HTTP_IDEMPOTENCY_KEY="k1"), 422)
    assert "Idempotency-Key" in error["fields"]


def test_a_disallowed_host_is_a_json_400(api: APIClient) -> None:
    assert error_of(api.get("/api/v1/messages/1", HTTP_HOST="evil.example"), 400)["code"] == "invalid"


def test_a_bug_is_a_json_500_that_says_nothing_of_the_internals(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.ROOT_URLCONF = __name__
    for url in ("/api/v1/test-boom", "/api/v1/test-plain-boom"):
        error = error_of(api.get(url), 500)
        assert error["code"] == "server_error" and "bug" not in error["message"]


def test_the_schema_documents_the_error_shape(api: APIClient) -> None:
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "Error" in schema["components"]["schemas"]
    responses = schema["paths"]["/api/v1/messages"]["post"]["responses"]
    assert {"400", "401", "413", "415"} <= set(responses)


# --- item 10: one mailbox, sent as given ------------------------------------------------------


BAD_MAILBOXES = [
    "evil@example.com Bcc: x@y.z",
    "a@example.com, b@example.com",
    "friends: a@example.com;",
    "Ann\r\nBcc: x@example.com <a@example.com>",
    "Ann (comment) <a@example.com>",
    "Ann <a@example.com> trailing",
    "not an address",
    # CPython's header parser raised on these instead of reporting a defect: each was a 500
    # (found by the stricter Schemathesis run of issue 18).
    "ann@",
    ":;:",
]


@pytest.mark.parametrize("value", BAD_MAILBOXES)
@pytest.mark.parametrize("field", ["from", "reply_to"])
def test_a_sender_that_is_not_exactly_one_mailbox_is_a_400(api: APIClient, field: str, value: str) -> None:
    error = error_of(api.post("/api/v1/messages", {**VALID, field: value}, format="json"), 400)
    assert field in error["fields"], error
    nothing_written()


@pytest.mark.parametrize("value", BAD_MAILBOXES)
def test_a_campaign_or_recurring_sender_that_is_not_one_mailbox_is_a_400(api: APIClient, value: str) -> None:
    audience = make_audience(1)
    Template.objects.create(name="t", subject="s", text="x")
    body = {"name": "c", "template": "t", "contact_list": audience.pk, "from_email": value}
    assert "from_email" in error_of(api.post("/api/v1/campaigns", body, format="json"), 400)["fields"]
    recurring = {**body, "cron": "0 9 * * *", "timezone": "UTC"}
    assert (
        "from_email"
        in error_of(api.post("/api/v1/recurring-schedules", recurring, format="json"), 400)["fields"]
    )
    assert Campaign.objects.count() == 0 and RecurringSchedule.objects.count() == 0


@pytest.mark.parametrize("value", ["evil@example.com Bcc: x@y.z", "a@example.com, b@example.com"])
def test_admin_campaign_and_recurring_forms_refuse_a_sender_that_is_not_one_mailbox(
    admin_client: Client, value: str
) -> None:
    audience = make_audience(1)
    template = Template.objects.create(name="t", subject="s", text="x")
    common = {"name": "c", "template": template.pk, "contact_list": audience.pk, "from_email": value,
              "priority": "normal"}  # fmt: skip
    for url, extra in (
        ("/admin/campaigns/campaign/add/", {"window_hours": 24}),
        ("/admin/scheduling/recurringschedule/add/", {"cron": "0 9 * * *", "timezone": "UTC",
                                                      "schedule_type": "immediate", "active": "on"}),
    ):  # fmt: skip
        response = admin_client.post(url, {**common, **extra})
        assert response.status_code == 200, url
        assert "from_email" in response.context["adminform"].form.errors, url
    assert Campaign.objects.count() == 0 and RecurringSchedule.objects.count() == 0
    good = admin_client.post(
        "/admin/campaigns/campaign/add/",
        {**common, "window_hours": 24, "from_email": '"Ann, B" <ann@example.org>'},
    )
    assert good.status_code == 302 and Campaign.objects.get().from_email == '"Ann, B" <ann@example.org>'


@pytest.mark.parametrize(
    ("given", "display", "address"),
    [
        ('"Ann, B" <ann@example.org>', "Ann, B", "ann@example.org"),
        ("Ann B <ann@example.org>", "Ann B", "ann@example.org"),
        ("Zoë Ünal <zoe@example.org>", "Zoë Ünal", "zoe@example.org"),
        ("Žluťoučký kůň úpěl ďábelské ódy, " * 3 + "<long@example.org>", ("Žluťoučký kůň úpěl ďábelské ódy, " * 3).strip(), "long@example.org"),
        ("bare@example.org", "", "bare@example.org"),
    ],
)  # fmt: skip
def test_a_valid_mailbox_is_sent_exactly_as_given(
    api: APIClient, smtp: SMTPTestServer, given: str, display: str, address: str
) -> None:
    if "," in display and not given.startswith('"'):
        given = f'"{display}" <{address}>'  # a comma in a name needs quotes (RFC 5322 specials)
    response = api.post("/api/v1/messages", {**VALID, "from": given, "reply_to": given}, format="json")
    assert response.status_code == 202, response.json()
    send_messages([response.json()["id"]])
    (received,) = smtp.wait_for(1)
    assert received.mail_from == address
    parsed = message_from_bytes(received.data, policy=policy.default)
    assert not parsed.defects
    for header in ("From", "Reply-To"):
        raw = _raw_header(received.data, header)
        # RFC 2047 decoding, which ignores the folding between encoded words.
        decoded = str(make_header(decode_header(raw)))
        assert decoded in (f"{display} <{address}>", f'"{display}" <{address}>', address), decoded
        # RFC 2047 §2: ASCII only, each encoded word at most 75 characters (a long name is folded).
        assert raw.isascii() and all(len(word) <= 75 for word in raw.split() if word.startswith("=?"))


def _raw_header(content: bytes, name: str) -> str:
    head = content.split(b"\r\n\r\n", 1)[0].decode("ascii")
    unfolded: list[str] = []
    for line in head.split("\r\n"):
        if line[:1] in (" ", "\t") and unfolded:
            unfolded[-1] += "\r\n" + line
        else:
            unfolded.append(line)
    (value,) = [
        line.split(":", 1)[1].strip() for line in unfolded if line.lower().startswith(name.lower() + ":")
    ]
    return value


# --- item 11: schedules in the past -----------------------------------------------------------


def _draft(api: APIClient) -> Campaign:
    return make_campaign(make_audience(3))


def test_a_local_time_that_has_passed_in_every_timezone_is_a_400(api: APIClient) -> None:
    campaign = _draft(api)
    body = {
        "type": "local_time",
        "local_date": "2020-01-01",
        "local_time": "09:00",
        "past_time_policy": "send_now",
    }
    error = error_of(api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", body, format="json"), 400)
    assert "local_date" in error["fields"]
    # Yesterday at this hour in UTC is still ahead in UTC-12 only for 12 more hours: 13 hours ago
    # has passed everywhere.
    gone = timezone.now() - timedelta(hours=25)
    body = {"type": "local_time", "local_date": gone.date().isoformat(), "local_time": gone.strftime("%H:%M")}
    assert (
        "local_date"
        in error_of(api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", body, format="json"), 400)["fields"]
    )
    campaign.refresh_from_db()
    assert campaign.status == "draft" and Message.objects.count() == 0 and OutboxTask.objects.count() == 0


def test_a_local_date_too_far_ahead_to_compute_is_a_400_not_a_500(api: APIClient) -> None:
    campaign = _draft(api)
    body = {"type": "local_time", "local_date": "9999-12-31", "local_time": "23:59"}
    error = error_of(api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", body, format="json"), 400)
    assert "local_date" in error["fields"]
    campaign.refresh_from_db()
    assert campaign.status == "draft" and OutboxTask.objects.count() == 0


def test_a_local_time_still_ahead_somewhere_is_accepted(api: APIClient) -> None:
    campaign = _draft(api)
    # Two hours ago in UTC: past for UTC contacts, still ahead in UTC-12 (10 hours to go).
    wall = timezone.now() - timedelta(hours=2)
    body = {"type": "local_time", "local_date": wall.date().isoformat(), "local_time": wall.strftime("%H:%M")}
    response = api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", body, format="json")
    assert response.status_code == 200, response.json()


def test_an_at_time_in_the_past_is_a_400_beyond_the_grace_and_sends_now_within_it(api: APIClient) -> None:
    campaign = _draft(api)
    body = {"type": "at", "scheduled_at": "2020-01-01T09:00:00Z"}
    error = error_of(api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", body, format="json"), 400)
    assert "scheduled_at" in error["fields"]
    campaign.refresh_from_db()
    assert campaign.status == "draft" and OutboxTask.objects.count() == 0
    just_now = (timezone.now() - timedelta(seconds=30)).isoformat()
    response = api.post(
        f"/api/v1/campaigns/{campaign.pk}/schedule", {"type": "at", "scheduled_at": just_now}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "sending"


def test_a_message_send_at_in_the_past_is_sent_now(api: APIClient) -> None:
    response = api.post("/api/v1/messages", {**VALID, "send_at": "2020-01-01T00:00:00Z"}, format="json")
    assert response.status_code == 202 and response.json()["status"] == "queued"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM core_outboxtask")
        assert cursor.fetchone()[0] == 1


# --- through the real web server ---------------------------------------------------------------


def test_through_gunicorn_oversized_chunked_deep_and_unknown_are_json_errors(
    stack: Any, web_port: int, api_key: Any
) -> None:
    import http.client

    stack.start_web(web_port, workers=1, extra_env={"EMAILHUB_API_MAX_BODY_BYTES": "8192"})
    auth = {"Authorization": f"Bearer {api_key[1]}", "Content-Type": "application/json"}

    def request(
        method: str, url: str, body: bytes | None = None, *, chunked: bool = False
    ) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
        try:
            connection.request(
                method, url, body=iter([body]) if chunked else body, headers=auth, encode_chunked=chunked
            )
            response = connection.getresponse()
            assert response.getheader("Content-Type", "").startswith("application/json")
            return response.status, json.loads(response.read())["error"]
        finally:
            connection.close()

    big = json.dumps({**VALID, "text": "x" * 10_000}).encode()
    status, error = request("POST", "/api/v1/messages", big)
    assert status == 413 and error["limit"] == {"name": "EMAILHUB_API_MAX_BODY_BYTES", "value": 8192}
    # Django reads no body without Content-Length; a chunked one would have parsed as empty.
    status, error = request("POST", "/api/v1/messages", big, chunked=True)
    assert status == 411 and error["code"] == "length_required"
    status, error = request("POST", "/api/v1/messages", b"[" * 3000 + b"]" * 3000)
    assert status == 400 and error["limit"]["name"] == "EMAILHUB_API_MAX_JSON_DEPTH"
    status, error = request("GET", "/api/v1/nowhere")
    assert status == 404 and error["code"] == "not_found"
    assert Message.objects.count() == 0
