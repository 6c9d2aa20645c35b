"""The operator's path in a real headless Chromium, against emailhub as deployed.

One module-scoped stack for every test here: gunicorn (`EMAILHUB_DEBUG=false`, static files
from WhiteNoise, as the README starts it), a transactional and a bulk Celery worker, the
scheduler, the session's local SMTP server and a superuser, all on the test database; one
Chromium (Debian's, driven by Playwright with `executable_path`: never `playwright install`).
Everything is stopped at the end and the database flushed.

The tests run in file order; the whole workflow (import, template, preview and test send,
campaign, schedule, dashboard, pause/resume, 100%) is one test, because each step needs what the
one before made. Each step saves a screenshot under SCREENSHOTS (printed at the end).

The campaign is sent under a real rate limit (SMTP_MAX_SEND_RATE, batches of 5) so that it is
still in flight while the dashboard and the pause button are looked at, and after the resume
while the dashboard redraws itself: 50 recipients take about 17 s.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis as redis_lib
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections

from campaigns.models import (
    Campaign,
    Contact,
    ContactList,
    ImportJob,
    ListMembership,
    Segment,
    Suppression,
    Template,
)
from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer, free_port
from operations.dashboard import _SHARED_KEY
from outbound.models import Endpoint
from outbound.services import endpoints
from scripts.stack import PROCESSES, READY_MARKERS, ROOT, Stack, with_option
from tests import factories
from tests.conftest import process_env

CHROMIUM = os.environ.get("EMAILHUB_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(
        f"browser tests skipped: no Chromium at {CHROMIUM} (install Debian's chromium package, "
        "or set EMAILHUB_CHROMIUM)",
        allow_module_level=True,
    )

from playwright.sync_api import (  # noqa: E402
    Browser,
    BrowserContext,
    Page,
    Playwright,
    Route,
    expect,
    sync_playwright,
)

# `django_db` so that pytest-django sets up the test database; the tests only read it (the
# processes and the browser write).
pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db]

# Without the background-networking flags Chromium's own services (update, sync, field trials)
# try hosts this closed network refuses; the page itself only ever talks to 127.0.0.1.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
SCREENSHOTS = Path(os.environ.get("EMAILHUB_BROWSER_SCREENSHOTS", ROOT / "var" / "browser-screenshots"))
OPERATOR_ZONE = "Europe/Paris"  # the browser's zone: admin.js hands it to the admin as a cookie
# Django admin's light theme: --header-bg is var(--secondary), #417690.
ADMIN_HEADER_BG = "rgb(65, 118, 144)"
RECIPIENTS = 50
SEND_RATE = 3  # messages/s for the SMTP provider: the campaign lasts ~RECIPIENTS / SEND_RATE s
BATCH = 5  # messages per bulk send task: what a worker has claimed when the pause comes
STEP_TIMEOUT_MS = 30_000


@dataclass
class Deployed:
    base: str
    username: str
    password: str
    smtp: SMTPTestServer
    # What the browser did that a deployed page must never do.
    foreign_requests: list[str] = field(default_factory=list)
    failed_static: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    shots: list[Path] = field(default_factory=list)


@pytest.fixture
def redis() -> Iterator[redis_lib.Redis]:
    """Overrides conftest's per-test flush: this module's processes share the test Redis database
    (broker queues and bindings, schedule index) for the whole module; `deployed` empties it
    before they start and after they stop."""
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture(scope="module")
def deployed(
    django_db_setup: Any,
    django_db_blocker: Any,
    smtp_server: SMTPTestServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployed]:
    env = process_env(
        smtp_server.port,
        EMAILHUB_OUTBOX_GRACE_SECONDS=str(settings.EMAILHUB_OUTBOX_GRACE_SECONDS),
        EMAILHUB_DEBUG="false",
        SMTP_MAX_SEND_RATE=str(SEND_RATE),
        EMAILHUB_BATCH_SIZE_NORMAL=str(BATCH),
    )
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    smtp_server.clear()
    stack = Stack(env=env, log_dir=tmp_path_factory.mktemp("browser") / "logs")
    password = "operator-" + os.urandom(6).hex()
    with django_db_blocker.unblock():
        try:
            get_user_model().objects.create_superuser("operator", "operator@example.com", password)
            port = free_port()
            # The workers and the scheduler start while gunicorn does (start-up is most of this
            # module's set-up); one child per worker: the machine is small and the rate capped.
            others = {
                name: with_option(PROCESSES[name], "--concurrency", "1")
                for name in ("worker-transactional", "worker-bulk")
            }
            others["scheduler"] = PROCESSES["scheduler"]
            for name, argv in others.items():
                stack.start(name, argv, ready=lambda _: True)
            stack.start_web(port, workers=2)
            _wait_ready(stack, list(others))
            yield Deployed(f"http://127.0.0.1:{port}", "operator", password, smtp_server)
        finally:
            stack.stop_all(graceful=False)  # the module is over: nothing left to finish
            smtp_server.clear()
            client.flushdb()
            client.close()
            call_command("flush", interactive=False, verbosity=0)


def _wait_ready(stack: Stack, keys: list[str], timeout: float = 60.0) -> None:
    """Wait for each process's ready line (scripts.stack.READY_MARKERS)."""
    deadline = time.monotonic() + timeout
    for key in keys:
        process = stack.processes[key]
        while READY_MARKERS[key] not in process.log():
            if not process.alive:
                raise RuntimeError(f"{key} exited during start-up:\n{process.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{key} not ready after {timeout:.0f} s:\n{process.log()[-3000:]}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[Browser]:
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API keeps an asyncio loop running on this thread (under greenlets), and
    # Django then refuses every ORM call here as "async unsafe". The ORM calls of this module are
    # plain synchronous reads between browser steps, so the check is lifted while the browser
    # runs, for this module only.
    lifted = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright: Playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        # The ORM calls made while Playwright's loop ran had a connection of their own (Django
        # keeps one per async context): closed here, or the test database's drop finds it open.
        connections.close_all()
        playwright.stop()
        if lifted is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = lifted
        shots = sorted(SCREENSHOTS.glob("*.png"))
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"\nbrowser screenshots ({len(shots)}): {SCREENSHOTS}")


@pytest.fixture(scope="module")
def context(browser: Browser, deployed: Deployed) -> Iterator[BrowserContext]:
    context = browser.new_context(
        viewport={"width": 1366, "height": 900},
        timezone_id=OPERATOR_ZONE,
        locale="en-GB",
        color_scheme="light",
    )
    context.set_default_timeout(STEP_TIMEOUT_MS)

    def same_origin(url: str) -> bool:
        return url == deployed.base or url.startswith((deployed.base + "/", "data:", "blob:", "about:"))

    def guard(route: Route) -> None:
        # Every request that would leave the browser passes here (one the page's own
        # Content-Security-Policy refuses never does): another origin's is recorded and
        # refused, so nothing leaves the machine and no test depends on the network refusing it.
        if same_origin(route.request.url):
            route.continue_()
        else:
            deployed.foreign_requests.append(route.request.url)
            route.abort("blockedbyclient")

    def on_response(response: Any) -> None:
        if "/static/" in response.url and response.status >= 400:
            deployed.failed_static.append(f"{response.status} {response.url}")

    context.route("**/*", guard)
    context.on("response", on_response)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="module")
def page(context: BrowserContext, deployed: Deployed) -> Page:
    page = context.new_page()
    page.on("pageerror", lambda error: deployed.page_errors.append(str(error)))
    return page


@pytest.fixture(autouse=True)
def screenshot_on_failure(request: pytest.FixtureRequest, page: Page, deployed: Deployed) -> Iterator[None]:
    """A failed test leaves a screenshot of where the browser was (the call's report is logged,
    and counted in testsfailed, before this teardown runs)."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        shot(page, deployed, f"FAILED-{request.node.name}")


def shot(page: Page, deployed: Deployed, name: str, *, full_page: bool = True) -> None:
    path = SCREENSHOTS / f"{len(deployed.shots) + 1:02d}-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    deployed.shots.append(path)


def log_in(page: Page, deployed: Deployed) -> None:
    page.goto(f"{deployed.base}/admin/")
    if page.locator("#id_username").count():
        page.fill("#id_username", deployed.username)
        page.fill("#id_password", deployed.password)
        page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(deployed.username)


def reload_until(page: Page, condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Reload the page (it does not refresh itself) until `condition` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} on {page.url}")
        time.sleep(0.5)
        page.reload()


def computed(page: Page, selector: str, prop: str) -> str:
    return str(page.eval_on_selector(selector, f"el => getComputedStyle(el).{prop}"))


def assert_admin_styled(page: Page) -> None:
    """The admin's stylesheet is loaded and applied (not only named in the HTML)."""
    assert computed(page, "#header", "backgroundColor") == ADMIN_HEADER_BG
    # base.css sets the admin's font stack; unstyled, Chromium's default serif remains.
    assert "sans-serif" in computed(page, "body", "fontFamily")
    sheets = page.evaluate(
        "() => [...document.styleSheets].filter(s => s.href).map(s => [s.href, s.cssRules.length])"
    )
    base = [rules for href, rules in sheets if re.search(r"/static/admin/css/base\.[0-9a-f]{12}\.css$", href)]
    assert base and base[0] > 100, f"the admin's hashed base.css is not applied: {sheets}"


# --- log in, styled admin, API docs ----------------------------------------------------------


def test_operator_logs_in_to_a_styled_admin_served_by_gunicorn(page: Page, deployed: Deployed) -> None:
    page.goto(f"{deployed.base}/admin/")
    expect(page.locator("#login-form")).to_be_visible()
    assert_admin_styled(page)
    # The login button is the admin's, not the browser's grey default.
    assert computed(page, "#login-form input[type=submit]", "backgroundColor") == ADMIN_HEADER_BG
    shot(page, deployed, "login-styled")

    page.fill("#id_username", deployed.username)
    page.fill("#id_password", deployed.password)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(deployed.username)
    expect(page.locator("#site-name")).to_contain_text("emailhub")
    assert_admin_styled(page)
    expect(page.locator("#nav-dashboard")).to_be_visible()
    # admin.js handed the browser's zone to the server: the next page shows times in it too.
    assert any(c["name"] == "emailhub_tz" and c["value"] == OPERATOR_ZONE for c in page.context.cookies())
    page.reload()
    expect(page.locator("#nav-timezone")).to_contain_text(OPERATOR_ZONE)
    shot(page, deployed, "admin-index-styled")
    assert not deployed.failed_static, deployed.failed_static

    # The check means something: the same page without /static/ (as before WhiteNoise) fails it.
    bare = page.context.new_page()
    try:
        bare.route("**/static/**", lambda route: route.abort())
        bare.goto(f"{deployed.base}/admin/")
        assert computed(bare, "#header", "backgroundColor") != ADMIN_HEADER_BG
        with pytest.raises(AssertionError):
            assert_admin_styled(bare)
    finally:
        bare.close()
    assert not deployed.page_errors, deployed.page_errors


def test_api_docs_list_every_operation_from_the_same_origin(page: Page, deployed: Deployed) -> None:
    schema = requests.get(f"{deployed.base}/api/schema/?format=json", timeout=30).json()
    methods = {"get", "post", "put", "patch", "delete"}
    operations = {(m.upper(), path) for path, item in schema["paths"].items() for m in item if m in methods}
    assert len(operations) > 20

    page.goto(f"{deployed.base}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text(schema["info"]["title"])
    expect(page.locator(".opblock").first).to_be_visible()
    listed = {
        (method, path)
        for method, path in page.eval_on_selector_all(
            ".opblock",
            """els => els.map(el => [
                el.querySelector('.opblock-summary-method').textContent.trim(),
                el.querySelector('.opblock-summary-path').getAttribute('data-path')])""",
        )
    }
    assert listed == operations, f"missing {operations - listed}, extra {listed - operations}"
    # The Bearer scheme is declared: Swagger offers to authorize.
    expect(page.locator(".swagger-ui .btn.authorize")).to_be_visible()
    # Swagger's own stylesheet applied (served from drf-spectacular-sidecar, not a CDN).
    assert computed(page, ".swagger-ui .opblock.opblock-post", "borderColor") == "rgb(73, 204, 144)"
    # The window, not the whole page: below the operations Swagger lists every schema model.
    shot(page, deployed, "swagger-operations", full_page=False)
    assert not deployed.foreign_requests, f"pages reached other origins: {deployed.foreign_requests}"
    assert not deployed.failed_static, deployed.failed_static
    assert not deployed.page_errors, deployed.page_errors


def test_redoc_lists_the_api_and_requests_nothing_from_another_origin(page: Page, deployed: Deployed) -> None:
    schema = requests.get(f"{deployed.base}/api/schema/?format=json", timeout=30).json()
    operations = {
        op["operationId"] for item in schema["paths"].values() for op in item.values() if "operationId" in op
    }
    assert len(operations) > 20
    foreign_before = list(deployed.foreign_requests)

    page.goto(f"{deployed.base}/api/redoc/")
    # Redoc renders the whole schema before its first heading: seconds on a loaded 2-core machine.
    expect(page.locator("h1").first).to_contain_text(schema["info"]["title"], timeout=30_000)
    # Redoc's side menu lists exactly the schema's operations.
    entries = page.locator("li[data-item-id*='/operation/']")
    expect(entries.first).to_be_attached()
    listed = {
        i.rsplit("/operation/", 1)[1] for i in entries.evaluate_all("els => els.map(e => e.dataset.itemId)")
    }
    assert listed == operations, f"missing {operations - listed}, extra {listed - operations}"
    # Its footer credit stays, as text; the logo it would load from cdn.redoc.ly is never requested.
    expect(page.get_by_text("API docs by Redocly")).to_be_visible()
    expect(page.locator("img[alt='redocly logo']")).to_have_count(0)
    # Search still works under the page's policy (Redoc indexes in a worker made from a blob:).
    page.fill("input.search-input", "campaign")
    results = page.locator("[data-role='search:results'] li[data-item-id*='/operation/v1_campaigns']")
    expect(results.first).to_be_visible()
    page.wait_for_load_state("networkidle")
    shot(page, deployed, "redoc-operations", full_page=False)
    assert deployed.foreign_requests == foreign_before, (
        f"/api/redoc/ reached other origins: {deployed.foreign_requests}"
    )
    assert not deployed.failed_static, deployed.failed_static
    assert not deployed.page_errors, deployed.page_errors


# --- the workflow: import, template, preview and test send, campaign to 100% ---------------


def _contacts_csv() -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["email", "name", "timezone"])
    for n in range(RECIPIENTS):
        writer.writerow([f"reader{n:02d}@audience.example.com", f"Reader {n:02d}", "America/New_York"])
    writer.writerow(["not-an-address", "Nobody", "UTC"])  # rejected, and shown as such
    return out.getvalue().encode()


def test_operator_imports_previews_test_sends_and_runs_a_campaign_to_100_percent(
    page: Page, deployed: Deployed
) -> None:
    log_in(page, deployed)

    # 1. Import a CSV into a new list; the job's page refreshes itself until it is done.
    page.goto(f"{deployed.base}/admin/campaigns/importjob/")
    page.click("#import-upload-link")
    page.set_input_files(
        "#id_file", files=[{"name": "readers.csv", "mimeType": "text/csv", "buffer": _contacts_csv()}]
    )
    page.fill("#id_list_name", "browser readers")
    shot(page, deployed, "import-form")
    page.click("#import-submit")
    progress = page.locator("#import-progress")
    expect(progress).to_have_attribute("data-status", "completed", timeout=STEP_TIMEOUT_MS)
    expect(progress).to_have_attribute("data-percent", "100")
    expect(page.locator("#import-rejections")).to_contain_text("not-an-address")
    shot(page, deployed, "import-done")
    audience = ContactList.objects.get(name="browser readers")
    assert ListMembership.objects.filter(contact_list=audience).count() == RECIPIENTS
    job = ImportJob.objects.get()
    assert (job.status, job.rows_created, job.rows_rejected) == ("completed", RECIPIENTS, 1)

    # 2. Create a template.
    page.goto(f"{deployed.base}/admin/campaigns/template/add/")
    page.fill("#id_name", "browser-welcome")
    page.fill("#id_subject", "Hello {{ name }}")
    page.fill("#id_html", "<p>Hi <b class='who'>{{ name }}</b>, welcome.</p>")
    page.fill("#id_text", "Hi {{ name }}, welcome.")
    page.click("input[name=_continue]")
    expect(page.locator("#template-preview-link")).to_be_visible()
    assert Template.objects.filter(name="browser-welcome").exists()

    # 3. Preview it with a chosen contact, then send a test.
    chosen = Contact.objects.get(email="reader07@audience.example.com")
    page.click("#template-preview-link")
    page.fill("#id_contact", chosen.email)
    page.click("#preview-submit")
    expect(page.locator("#preview-subject")).to_have_text("Hello Reader 07")
    expect(page.frame_locator("#preview-frame").locator("b.who")).to_have_text("Reader 07")
    expect(page.locator("#preview-text")).to_contain_text("Hi Reader 07, welcome.")
    page.fill("#test-send-to", "operator@example.com")
    page.select_option("#test-send-priority", "critical")
    shot(page, deployed, "template-preview")
    page.click("#test-send-submit")
    link = page.locator("#test-send-message")
    expect(link).to_be_visible()
    test_id = int(re.findall(r"\d+", link.inner_text())[0])
    deadline = time.monotonic() + 20
    while not [m for m in deployed.smtp.messages if m.rcpt_tos == ["operator@example.com"]]:
        assert time.monotonic() < deadline, "the test send never reached the SMTP server"
        time.sleep(0.1)
    (received,) = [m for m in deployed.smtp.messages if m.rcpt_tos == ["operator@example.com"]]
    assert received.parsed()["Subject"] == "Hello Reader 07"
    link.click()
    status = page.locator(".field-status .readonly")
    reload_until(page, lambda: status.inner_text().strip().lower() == "sent", 20, "the test send sent")
    assert Message.objects.get(pk=test_id).status == "sent"
    shot(page, deployed, "test-send-message")

    # 4. Create a campaign for the imported list and schedule it `at` a wall time in the
    #    operator's zone (this minute: it starts at once, in the past by under a minute).
    page.goto(f"{deployed.base}/admin/campaigns/campaign/add/")
    page.fill("#id_name", "Browser launch")
    page.select_option("#id_template", label="browser-welcome")
    page.select_option("#id_contact_list", label="browser readers")
    page.select_option("#id_priority", "normal")
    page.click("input[name=_continue]")
    expect(page.locator("#campaign-schedule-link")).to_be_visible()
    campaign = Campaign.objects.get(name="Browser launch")
    page.click("#campaign-schedule-link")
    expect(page.locator("#id_zone")).to_have_value(OPERATOR_ZONE)
    wall = datetime.now(ZoneInfo(OPERATOR_ZONE)).replace(second=0, microsecond=0)
    # No type is chosen for the operator: the date alone is refused, not sent at once.
    expect(page.locator("#schedule-form input[name=type]:checked")).to_have_count(0)
    page.fill("#id_scheduled_at", wall.strftime("%Y-%m-%dT%H:%M"))
    page.click("#schedule-submit")
    expect(page.locator("#schedule-form .field-type .errorlist")).to_contain_text("choose when to send")
    campaign.refresh_from_db()
    assert campaign.status == "draft"
    page.check("#id_type_1")  # at
    shot(page, deployed, "schedule-form")
    page.click("#schedule-submit")
    expect(page.locator("#campaign-progress")).to_have_attribute(
        "data-status", re.compile("sending|completed")
    )
    campaign.refresh_from_db()
    # The wall time was read in the operator's zone, not as UTC.
    assert (campaign.schedule_type, campaign.scheduled_at) == ("at", wall.astimezone(ZoneInfo("UTC")))

    # 5. The dashboard shows it in flight.
    page.goto(f"{deployed.base}/admin/dashboard/")
    row = page.locator(f"tr.campaign-row[data-campaign-id='{campaign.pk}']")
    expect(row.locator(".campaign-status")).to_contain_text("sending")
    bar = row.locator("progress.campaign-progress")
    assert float(bar.get_attribute("value") or 0) < 100, "the campaign finished before the dashboard saw it"
    expect(row.locator(".campaign-total")).to_have_text(str(RECIPIENTS))
    shot(page, deployed, "dashboard-campaign-in-progress")

    # 6. Pause from the campaign's page: sending stops short of the end.
    page.goto(f"{deployed.base}/admin/campaigns/campaign/{campaign.pk}/change/")
    page.click("#campaign-pause")
    expect(page.locator("#campaign-progress")).to_have_attribute("data-status", "paused")
    expect(page.locator("#campaign-resume")).to_be_visible()
    # A batch a worker had claimed before the pause finishes; then nothing more is sent.
    paused_at = _settled_sent_count(campaign.pk)
    assert paused_at < RECIPIENTS, "the campaign was finished before the pause took effect"
    time.sleep(2)
    assert _sent_count(campaign.pk) == paused_at, "messages were sent while the campaign was paused"
    page.reload()
    shot(page, deployed, "campaign-paused")

    # Resume; the open dashboard redraws the progress by itself (no reload) as sending goes on.
    page.click("#campaign-resume")
    expect(page.locator("#campaign-progress")).to_have_attribute(
        "data-status", re.compile("sending|completed")
    )
    page.goto(f"{deployed.base}/admin/dashboard/")
    refreshed_at = page.get_attribute("#dashboard", "data-refreshed-at")
    shown = float(row.locator("progress.campaign-progress").get_attribute("value") or 0)
    page.wait_for_function(
        """([id, before]) => {
            const bar = document.querySelector(`progress.campaign-progress[data-campaign-id='${id}']`);
            return bar && Number(bar.value) > before; }""",
        arg=[campaign.pk, shown],
        timeout=STEP_TIMEOUT_MS,
    )
    assert page.get_attribute("#dashboard", "data-refreshed-at") != refreshed_at  # redrawn by dashboard.js
    shot(page, deployed, "dashboard-redrawn-after-resume")
    page.goto(f"{deployed.base}/admin/campaigns/campaign/{campaign.pk}/change/")

    # 7. Progress reaches 100% and the campaign completes; every reader got it exactly once.
    progress = page.locator("#campaign-progress")
    reload_until(
        page,
        lambda: progress.get_attribute("data-status") == "completed",
        RECIPIENTS / SEND_RATE + 30,
        "the campaign to complete",
    )
    expect(progress).to_have_attribute("data-percent", "100")
    expect(page.locator("#campaign-percent")).to_have_text("100%")
    shot(page, deployed, "campaign-completed")
    campaign.refresh_from_db()
    assert (campaign.status, campaign.sent_count, campaign.total_count) == (
        "completed",
        RECIPIENTS,
        RECIPIENTS,
    )
    readers = sorted(r for m in deployed.smtp.messages for r in m.rcpt_tos if r != "operator@example.com")
    assert readers == [f"reader{n:02d}@audience.example.com" for n in range(RECIPIENTS)]

    # Its messages are one click away.
    page.click("#campaign-messages-link")
    expect(page.locator("#result_list tbody tr")).to_have_count(min(RECIPIENTS, 100))
    shot(page, deployed, "campaign-messages")

    assert not deployed.foreign_requests, f"pages reached other origins: {deployed.foreign_requests}"
    assert not deployed.failed_static, deployed.failed_static
    assert not deployed.page_errors, deployed.page_errors


def _sent_count(campaign_id: int) -> int:
    return Message.objects.filter(campaign_id=campaign_id, status="sent").count()


def _settled_sent_count(campaign_id: int, timeout: float = 20.0) -> int:
    """The campaign's sent count once it has stopped moving for twice a batch's time under the
    rate limit (so the batch claimed before the pause, still waiting for tokens, is counted)."""
    quiet_seconds = 2 * BATCH / SEND_RATE
    deadline = time.monotonic() + timeout
    last, since = _sent_count(campaign_id), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _sent_count(campaign_id)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return now
    raise AssertionError(f"sending went on for {timeout:.0f} s after the pause ({last} sent)")


# --- outbound webhooks: an endpoint a 410 disabled, enabled again ---------------------------


@pytest.fixture(scope="module")
def gone_endpoint(django_db_setup: Any, django_db_blocker: Any) -> Endpoint:
    """An endpoint as a delivery answered 410 left it (no webhook worker runs here: nothing is
    sent to it). Made outside the test's transaction, as `deployed` makes the operator, so that
    gunicorn sees it."""
    with django_db_blocker.unblock():
        key, _ = factories.api_key("send", "read")
        endpoint, _ = endpoints.create(key, "https://93.184.216.34/hooks/emailhub")
        assert endpoints.disable(endpoint.pk, "the endpoint answered 410 Gone")
    return endpoint


def test_operator_enables_from_the_dashboard_an_endpoint_a_410_disabled(
    page: Page, deployed: Deployed, redis: redis_lib.Redis, gone_endpoint: Endpoint
) -> None:
    endpoint = gone_endpoint
    # The dashboard's data is shared for a few seconds (operations.dashboard): a test before this
    # one may have left some from before the endpoint was disabled.
    for stale in redis.scan_iter(_SHARED_KEY.format(zone="*")):
        redis.delete(stale)
    log_in(page, deployed)

    page.goto(f"{deployed.base}/admin/dashboard/")
    row = page.locator(f"#webhook-rows tr.webhook-row[data-endpoint-id='{endpoint.pk}']")
    expect(row).to_contain_text("disabled")
    expect(row).to_contain_text("the endpoint answered 410 Gone")
    shot(page, deployed, "dashboard-endpoint-gone")
    row.get_by_role("link", name=f"#{endpoint.pk}").click()
    expect(page).to_have_url(f"{deployed.base}/admin/outbound/endpoint/{endpoint.pk}/change/")
    expect(page.locator("#id_enabled")).not_to_be_checked()
    expect(page.locator(".field-disabled_reason .readonly")).to_have_text("the endpoint answered 410 Gone")

    # The Enable action, from the list of endpoints.
    page.locator(".breadcrumbs").get_by_role("link", name="Endpoints").click()
    listed = page.locator("#result_list tbody tr").filter(
        has=page.locator(f"input.action-select[value='{endpoint.pk}']")
    )
    listed.locator("input.action-select").check()
    page.select_option("select[name=action]", "enable_endpoints")
    page.get_by_role("button", name="Go").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Enabled")
    expect(listed.locator("td.field-enabled img")).to_have_attribute("alt", "True")
    shot(page, deployed, "endpoint-enabled")
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.disabled_reason, endpoint.disabled_at) == (True, "", None)
    assert not deployed.foreign_requests, f"pages reached other origins: {deployed.foreign_requests}"
    assert not deployed.failed_static, deployed.failed_static
    assert not deployed.page_errors, deployed.page_errors


# --- segments: preview before saving, a bad value named by its path -------------------------

SEGMENT_PLAN = "browser-gold"


@pytest.fixture(scope="module")
def segment_people(django_db_setup: Any, django_db_blocker: Any) -> list[Contact]:
    """Contacts of a plan no other test uses: three with 5 seats or more (one of them
    suppressed), one with fewer. Made outside the test's transaction, so that gunicorn sees them."""
    with django_db_blocker.unblock():
        made = [
            Contact.objects.create(
                email=f"seat{seats}@segment.example.com",
                name=f"Seats {seats}",
                timezone="Asia/Tokyo",
                attributes={"plan": SEGMENT_PLAN, "seats": seats},
            )
            for seats in (2, 5, 8, 12)
        ]
        Suppression.objects.create(email="seat12@segment.example.com", reason="complaint")
    return made


def test_operator_previews_a_segment_sees_a_bad_value_by_its_path_and_saves_it(
    page: Page, deployed: Deployed, segment_people: list[Contact]
) -> None:
    log_in(page, deployed)
    page.goto(f"{deployed.base}/admin/campaigns/segment/add/")
    expect(page.locator(".field-filter .help")).to_contain_text("list membership")  # the legend
    page.fill("#id_name", "browser gold, 5 seats or more")

    def filter_of(seats: object) -> str:
        plan = {"attribute": "plan", "type": "string", "op": "equals", "value": SEGMENT_PLAN}
        return json.dumps(
            {"and": [plan, {"attribute": "seats", "type": "number", "op": "gte", "value": seats}]}
        )

    # 1. Preview: the count and the sample, nothing saved (the suppressed contact is left out).
    page.fill("#id_filter", filter_of(5))
    page.click("#segment-preview-submit")
    expect(page.locator("#segment-preview-count")).to_have_text("2")
    rows = page.locator("#segment-sample tr.segment-sample-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("seat5@segment.example.com")
    expect(rows.nth(0)).to_contain_text("Asia/Tokyo")
    expect(rows.nth(1)).to_contain_text("seat8@segment.example.com")
    # The form comes back as typed, pretty-printed, ready to save.
    assert json.loads(page.input_value("#id_filter")) == json.loads(filter_of(5))
    shot(page, deployed, "segment-preview")
    assert not Segment.objects.exists()

    # 2. A string where a number belongs: an error naming the node's path, and no preview.
    page.fill("#id_filter", filter_of("5"))
    page.click("#segment-preview-submit")
    expect(page.locator(".field-filter .errorlist")).to_have_text(
        "and[1].value: must be a number; got a string"
    )
    expect(page.locator("#segment-preview")).to_have_count(0)
    shot(page, deployed, "segment-path-error")
    # Saving it is refused the same way.
    page.click("input[name=_continue]")
    expect(page.locator(".field-filter .errorlist")).to_contain_text("and[1].value")
    assert not Segment.objects.exists()

    # 3. Fixed and saved: the segment's page counts it.
    page.fill("#id_filter", filter_of(8))
    page.click("input[name=_continue]")
    expect(page.locator("#segment-current-count")).to_have_text("1")
    shot(page, deployed, "segment-saved")
    segment = Segment.objects.get()
    assert (segment.name, segment.filter) == ("browser gold, 5 seats or more", json.loads(filter_of(8)))
    assert not deployed.foreign_requests, f"pages reached other origins: {deployed.foreign_requests}"
    assert not deployed.failed_static, deployed.failed_static
    assert not deployed.page_errors, deployed.page_errors
