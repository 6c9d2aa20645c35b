"""The ways to run emailhub agree: scripts/stack.py, docker-compose.yml, the README, .ci/run;
production's requirements are what it runs; static files and API docs are served as deployed."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import requests
import yaml
from django.utils import timezone
from packaging.requirements import Requirement

import emailhub.settings as production_settings
from campaigns.models import Campaign
from delivery.models import Message
from scheduling.models import RecurringSchedule
from scripts.demo_cleanup import retire_demo_work
from scripts.stack import PROCESSES, ROOT

# Options whose values legitimately differ between a laptop and a container network.
ADDRESS_OPTIONS = {"--bind", "--host"}


def _without_addresses(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ADDRESS_OPTIONS:
            skip = True
        else:
            kept.append(arg)
    return kept


def test_docker_compose_parses_and_runs_every_process_with_the_same_command() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis"} <= set(services)
    for name, argv in PROCESSES.items():
        assert name in services, f"docker-compose.yml has no service {name!r}"
        assert _without_addresses(services[name]["command"]) == _without_addresses(argv), name
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgres://")


def test_readme_starts_with_the_two_commands_and_shows_every_process_command() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()[1:]] == [
        "make demo",
        "make test",
    ]
    for name, argv in PROCESSES.items():
        assert " ".join(argv) in readme, f"README does not show the {name} command: {' '.join(argv)}"


def test_every_process_has_a_systemd_unit_with_the_same_command_that_restarts_it_always() -> None:
    for name, argv in PROCESSES.items():
        if name == "smtp-sink":
            continue  # development only
        unit = (ROOT / "deploy" / "systemd" / f"emailhub-{name}.service").read_text()
        [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
        executable, *args = exec_start.removeprefix("ExecStart=").replace("%%", "%").split()
        assert executable.endswith(f"/.venv/bin/{argv[0]}"), name
        assert args == argv[1:], name
        assert "\nRestart=always\n" in unit, name


def test_compose_checks_each_workers_liveness_under_its_own_node_name() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("worker-transactional", "worker-bulk", "worker-webhooks"):
        command = services[name]["command"]
        node = command[command.index("-n") + 1]
        assert services[name]["healthcheck"]["test"] == ["CMD", "python", "-m", "core.liveness", node]
        assert services[name]["restart"] == "unless-stopped"


def test_both_worker_pools_take_the_housekeeping_queue_and_only_one_takes_critical_mail() -> None:
    queues = {
        name: PROCESSES[name][PROCESSES[name].index("-Q") + 1].split(",")
        for name in PROCESSES
        if "-Q" in PROCESSES[name]
    }
    # The webhooks worker takes its own queue only: no receiver ever holds a process sending mail.
    assert queues.pop("worker-webhooks") == ["webhooks"]
    assert all("system" in taken for taken in queues.values()), queues
    assert [name for name, taken in queues.items() if "critical" in taken] == ["worker-transactional"]
    assert not {"critical", "high"} & set(queues["worker-bulk"])


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


# --- requirements: production holds what emailhub runs, nothing else ---------------------------

PRODUCTION_DIRS = ("emailhub", "core", "fastpaths", "campaigns", "delivery", "scheduling", "operations")
# delivery/testing/ holds the local servers the tests, the demo and the benchmarks use (moto's
# SES, a SendGrid stand-in). Production reaches only what a production module imports from it
# (manage.py smtp_sink imports its SMTP server, hence aiosmtpd), which the scan below follows.
TEST_SUPPORT = "delivery/testing/"
# Needed at run time although no module imports them by name.
RUNTIME_ONLY = {
    "psycopg2-binary": "Django's postgresql backend imports psycopg2",
}
# Tools that must never reach the production file or the image.
DEV_TOOLS = {
    "pytest", "pytest-django", "pytest-timeout", "mypy", "ruff", "django-stubs",
    "djangorestframework-stubs", "celery-types", "moto", "flask", "flask-cors", "docker",
    "cfn-lint", "responses", "werkzeug-stubs", "schemathesis", "hypothesis", "dkimpy", "playwright",
    "django-post-office", "py-spy", "coverage", "aws-xray-sdk", "time-machine",
}  # fmt: skip


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> list[tuple[str, str]]:
    """(name as written, version) for each requirement line; every one must be `name==version`."""
    pins = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[a-z0-9,_-]+\])?==([A-Za-z0-9.+!-]+)", line)
        assert match, f"{path.name}:{number}: not an exact pin `name==version`: {raw!r}"
        pins.append((match[1], match[3]))
    return pins


def _dependency_closure(names: set[str]) -> set[str]:
    """Every distribution `names` need at run time (installed metadata; markers for this Python)."""
    seen: set[str] = set()
    todo = sorted(names)
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name} is pinned but not installed: .venv/bin/pip install -r requirements.txt")
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def _imported_modules(path: Path) -> set[str]:
    """Modules a file imports at run time (not those under `if TYPE_CHECKING:`, which mypy reads)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _production_roots() -> dict[str, str]:
    """Distribution -> why production needs it: imports, settings strings, process commands."""
    distributions = importlib.metadata.packages_distributions()
    first_party = set(PRODUCTION_DIRS) | {"scripts", "tests", "bench"}
    roots: dict[str, str] = dict(RUNTIME_ONLY)

    def need(module: str, why: str) -> None:
        top = module.split(".")[0]
        if top in first_party or top in sys.stdlib_module_names:
            return
        for dist in distributions.get(top, []):
            if not dist.endswith("-stubs") and not dist.startswith("types-"):
                roots.setdefault(_canonical(dist), why)

    files = [ROOT / "manage.py"] + [
        p for d in PRODUCTION_DIRS for p in (ROOT / d).rglob("*.py") if TEST_SUPPORT not in p.as_posix()
    ]
    scanned: set[Path] = set()
    while files:
        path = files.pop()
        if path in scanned:
            continue
        scanned.add(path)
        for module in _imported_modules(path):
            if module.startswith("delivery.testing"):  # test support a production module uses
                target = ROOT / (module.replace(".", "/") + ".py")
                files.append(target if target.exists() else ROOT / module.replace(".", "/") / "__init__.py")
            need(module, f"imported by {path.relative_to(ROOT)}")

    def strings(value: object) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from strings(item)

    for name in dir(production_settings):
        if name.isupper():
            for text in strings(getattr(production_settings, name)):
                if re.fullmatch(r"[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", text):
                    need(text, f"named in settings.{name}")
    for argv in PROCESSES.values():
        need(argv[0], f"the command of {argv[:2]}")
    return roots


def test_requirements_are_exact_pins_sorted_by_name_and_in_one_file_only() -> None:
    names = {}
    for path in (ROOT / "requirements.txt", ROOT / "requirements-dev.txt"):
        pins = [_canonical(name) for name, _ in _pins(path)]
        assert pins == sorted(pins), f"{path.name} is not sorted by name: add a line in its place"
        assert len(pins) == len(set(pins)), f"{path.name} pins a package twice"
        names[path.name] = set(pins)
    both = names["requirements.txt"] & names["requirements-dev.txt"]
    assert not both, f"pinned in both files: {sorted(both)}"


def test_production_requirements_are_exactly_what_emailhub_imports_and_runs_with_dependencies() -> None:
    roots = _production_roots()
    needed = _dependency_closure(set(roots))
    pinned = {_canonical(name) for name, _ in _pins(ROOT / "requirements.txt")}
    missing = sorted(needed - pinned)
    assert not missing, "production needs these, requirements.txt lacks them: " + ", ".join(
        f"{name} ({roots.get(name, 'a dependency')})" for name in missing
    )
    extra = sorted(pinned - needed)
    assert not extra, (
        f"requirements.txt pins what production never imports or runs: {extra} "
        "(test and dev tools belong in requirements-dev.txt)"
    )


def test_the_two_requirements_files_pin_every_dependency_of_what_they_pin() -> None:
    pinned = {
        _canonical(name)
        for path in (ROOT / "requirements.txt", ROOT / "requirements-dev.txt")
        for name, _ in _pins(path)
    }
    unpinned = sorted(_dependency_closure(pinned) - pinned)
    assert not unpinned, f"needed by a pinned package but not pinned: {unpinned}"
    for name, version in _pins(ROOT / "requirements.txt") + _pins(ROOT / "requirements-dev.txt"):
        installed = importlib.metadata.version(name)
        assert installed == version, f"{name} is pinned at {version} but {installed} is installed"


def test_no_test_or_dev_tool_reaches_requirements_txt_or_the_docker_image() -> None:
    production = {_canonical(name) for name, _ in _pins(ROOT / "requirements.txt")}
    tools = sorted(
        name
        for name in production
        if name in DEV_TOOLS or name.startswith(("types-", "pytest")) or name.endswith("-stubs")
    )
    assert not tools, f"dev/test tools in requirements.txt: {tools}"
    dev = {_canonical(name) for name, _ in _pins(ROOT / "requirements-dev.txt")}
    assert {"pytest", "pytest-django", "mypy", "ruff", "django-stubs", "moto"} <= dev
    # The image installs requirements.txt and nothing else.
    dockerfile = (ROOT / "Dockerfile").read_text()
    instructions = re.sub(r"\\\n", " ", dockerfile).splitlines()
    installs = [line for line in instructions if re.search(r"\bpip3?\b.*\binstall\b", line)]
    assert installs, "the Dockerfile installs no requirements"
    for line in installs:
        arguments = line.split("install", 1)[1].split()
        files = [arguments[i + 1] for i, arg in enumerate(arguments) if arg in ("-r", "--requirement")]
        assert files == ["requirements.txt"], f"the image must install only requirements.txt: {line!r}"
        assert not [a for a in arguments if not a.startswith("-") and a not in files], line
    assert not [line for line in instructions if "requirements-dev" in line and not line.startswith("#")]
    # `make venv` (and so `make test`) installs both.
    assert re.search(
        r"pip install .*-r requirements\.txt -r requirements-dev\.txt", (ROOT / "Makefile").read_text()
    )


# --- static files and set-up: every documented way of running --------------------------------


def _make_prerequisites(target: str) -> list[str]:
    match = re.search(rf"^{target}:([^\n]*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile has no {target} target"
    return match[1].split()


def _make_recipe(target: str) -> str:
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile has no recipe for {target}"
    return match[1]


def test_setup_creates_the_database_migrates_and_collects_static_and_demo_and_test_run_it() -> None:
    recipe = _make_recipe("setup")
    assert "scripts/ensure_db.py" in recipe and "migrate --noinput" in recipe
    assert "collectstatic --noinput" in recipe
    # The README says both commands create and migrate the `emailhub` database its next steps use.
    assert "setup" in _make_prerequisites("demo") and "setup" in _make_prerequisites("test")
    readme = (ROOT / "README.md").read_text()
    assert "`emailhub` database created and migrated" in readme
    # The image collects its static files at build time; compose runs that image.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "collectstatic --noinput" in dockerfile
    assert dockerfile.index("collectstatic") > dockerfile.index("COPY . .")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["web"]["build"] == "."


def test_the_demo_runs_on_its_own_database_never_the_readme_one() -> None:
    demo = (ROOT / "scripts" / "demo.py").read_text()
    assert re.search(r'os\.environ\["DATABASE_URL"\] = DEMO_DATABASE_URL', demo)
    assert (
        "/emailhub_demo" in demo
        and "/emailhub_demo" in _make_recipe("demo") + (ROOT / "Makefile").read_text()
    )
    assert "retire_demo_work()" in demo


def test_readme_sending_a_message_starts_the_web_process_and_workers_first() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Sending a message", 1)[1].split("\n## ", 1)[0]
    first_request = section.index("curl ")
    for name in ("web", "worker-transactional", "scheduler"):
        command = " ".join(PROCESSES[name])
        assert command in section[:first_request], f"'Sending a message' does not start {name} first"
    assert "make setup" in section[:first_request]


def test_ci_installs_debians_chromium_and_never_downloads_a_browser() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"if \[ ! -x /usr/bin/chromium \]", ci)
    assert re.search(
        r"DEBIAN_FRONTEND=noninteractive apt-get install -y [^\n]*--no-install-recommends chromium", ci
    )
    assert ci.index("chromium") < ci.index("make test")
    for path in (ROOT / ".ci" / "run", ROOT / "Makefile", ROOT / "Dockerfile"):
        commands = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in commands if "playwright install" in line], path


class _Links(HTMLParser):
    """Every URL a page makes the browser load: src, href and spec-url attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href", "spec-url") and value]


def _same_origin_urls(base: str, html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    # Swagger UI's inline initializer names the schema: url: "/api/schema/".
    urls = parser.urls + re.findall(r'\burl:\s*"([^"]+)"', html)
    assert urls, "the page loads nothing"
    origin = urlsplit(base)
    for url in urls:
        absolute = urlsplit(urljoin(base, url))
        assert (absolute.scheme, absolute.netloc) == (origin.scheme, origin.netloc), (
            f"{url} is not same-origin"
        )
    return [urljoin(base, url) for url in urls]


@pytest.mark.processes
def test_static_files_and_api_docs_are_served_by_gunicorn_with_debug_off_from_the_same_origin(
    stack,
    web_port: int,  # noqa: ANN001
) -> None:
    stack.start_web(web_port, workers=1, extra_env={"EMAILHUB_DEBUG": "false"})
    base = f"http://127.0.0.1:{web_port}"
    session = requests.Session()

    # The browser tests load the admin's stylesheet by its plain name.
    css = session.get(f"{base}/static/admin/css/base.css", timeout=10)
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")
    assert "--body-bg" in css.text or "body" in css.text

    # The admin's pages name hashed, compressed files, cached for a year.
    login = session.get(f"{base}/admin/login/", timeout=10)
    assert login.status_code == 200
    stylesheets = re.findall(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', login.text)
    assert stylesheets, "the admin login page names no hashed base.css"
    hashed = session.get(base + stylesheets[0], headers={"Accept-Encoding": "gzip"}, timeout=10)
    # The hashed copy: the same stylesheet, its url()s rewritten to hashed names too.
    assert hashed.status_code == 200 and re.search(
        r"url\(\"\.\./img/[\w-]+\.[0-9a-f]{12}\.svg\"\)", hashed.text
    )
    assert hashed.headers.get("Content-Encoding") == "gzip"
    assert "max-age=315360000" in hashed.headers["Cache-Control"]

    for page, marker in (("/api/docs/", "swagger-ui-bundle"), ("/api/redoc/", "redoc.standalone")):
        response = session.get(base + page, timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
        html = response.text
        assert marker in html
        assert not re.findall(r"""https?://|["']//""", html), f"{page} names another origin"
        if page == "/api/redoc/":
            # Its bundle names one (the footer's logo, cdn.redoc.ly): the page's policy refuses it.
            policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
            assert policy and "default-src 'self'" in policy[1] and "img-src 'self' data:" in policy[1]
        urls = _same_origin_urls(base + page, html)
        assert any("/static/drf_spectacular_sidecar/" in url for url in urls)
        for url in urls:
            loaded = session.get(url, timeout=10)
            assert loaded.status_code == 200, f"{page} loads {url}: {loaded.status_code}"
            assert len(loaded.content) > 0
    schema = session.get(f"{base}/api/schema/", timeout=10)
    assert schema.status_code == 200 and b"openapi" in schema.content


# --- the demo leaves nothing active ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_demo_runs_in_a_row_leave_no_active_schedule_campaign_or_pending_message(api) -> None:  # noqa: ANN001
    contacts = [
        api.post("/api/v1/contacts", {"email": f"reader{n}@audience.example.com"}, format="json")
        for n in range(3)
    ]
    assert all(c.status_code == 201 for c in contacts), contacts[0].content
    audience = api.post("/api/v1/lists", {"name": "demo audience"}, format="json").json()
    added = api.post(
        f"/api/v1/lists/{audience['id']}/members",
        {"contact_ids": [c.json()["id"] for c in contacts]},
        format="json",
    )
    assert added.status_code in (200, 201), added.content
    template = {"name": "demo-newsletter", "subject": "News", "html": "<p>Hi</p>", "text": "Hi"}
    assert api.post("/api/v1/templates", template, format="json").status_code == 201

    for run in range(2):  # what one demo run leaves before its clean-up, twice
        schedule = api.post(
            "/api/v1/recurring-schedules",
            {
                "name": f"demo every minute {run}", "cron": "* * * * *", "timezone": "Europe/London",
                "template": "demo-newsletter", "contact_list": audience["id"], "priority": "low",
            },
            format="json",
        )  # fmt: skip
        assert schedule.status_code == 201, schedule.content
        campaign = api.post(
            "/api/v1/campaigns",
            {"name": f"demo newsletter {run}", "template": "demo-newsletter", "contact_list": audience["id"]},
            format="json",
        ).json()
        later = (timezone.now() + timedelta(hours=1)).isoformat()
        scheduled = api.post(
            f"/api/v1/campaigns/{campaign['id']}/schedule",
            {"type": "at", "scheduled_at": later},
            format="json",
        )
        assert scheduled.status_code == 200, scheduled.content
        message = api.post(
            "/api/v1/messages",
            {"to": "later@demo.example.com", "subject": "s", "text": "t", "send_at": later},
            format="json",
        )
        assert message.status_code == 202, message.content
        assert RecurringSchedule.objects.filter(active=True).count() == 1

        retired = retire_demo_work()

        assert retired.schedules == [schedule.json()["id"]]
        assert retired.campaigns == [campaign["id"]]
        assert retired.messages == [message.json()["id"]]
        assert not RecurringSchedule.objects.filter(active=True).exists()
        assert not RecurringSchedule.objects.exclude(next_run=None).exists()  # beat has nothing due
        assert Campaign.objects.get(pk=campaign["id"]).status == Campaign.Status.CANCELLED
        assert Message.objects.get(pk=message.json()["id"]).status == "cancelled"
    # A second clean-up finds nothing left to stop.
    again = retire_demo_work()
    assert (again.schedules, again.campaigns, again.messages) == ([], [], [])
