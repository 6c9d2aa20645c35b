"""The ways to run emailhub agree: scripts/stack.py, docker-compose.yml, the README, .ci/run."""

from __future__ import annotations

import yaml

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


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()
