# The two commands: `make demo` and `make test`. Each sets up what it needs on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
# The demo's own database (scripts/demo.py creates and migrates it): never the `emailhub` one the
# README's examples use.
DEMO_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/emailhub_demo

.PHONY: demo test setup venv services lint bench

# Production packages (requirements.txt, all the Docker image gets) plus the test and dev tools.
$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

services:
	@scripts/ensure_services.sh

# The `emailhub` database created and migrated, the static files collected (gunicorn serves
# them with WhiteNoise): what the README's "Running each process by hand" needs.
setup: venv services
	@$(PY) scripts/ensure_db.py
	@$(PY) manage.py migrate --noinput -v0
	@$(PY) manage.py collectstatic --noinput -v0

demo: setup
	DEMO_DATABASE_URL=$(DEMO_DATABASE_URL) $(PY) scripts/demo.py

test: setup
	@test -x "$${EMAILHUB_CHROMIUM:-/usr/bin/chromium}" || echo "browser tests skipped: no Chromium at $${EMAILHUB_CHROMIUM:-/usr/bin/chromium} (install Debian's chromium package)"
	$(PY) -m pytest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy emailhub core fastpaths campaigns delivery outbound scheduling operations scripts
