# The two commands: `make demo` and `make test`. Each sets up what it needs on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)

.PHONY: demo test setup venv services lint bench

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

services:
	@scripts/ensure_services.sh

setup: venv services
	@$(PY) scripts/ensure_db.py
	@$(PY) manage.py migrate --noinput -v0

demo: setup
	$(PY) scripts/demo.py

test: venv services
	$(PY) -m pytest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy emailhub core campaigns delivery scheduling scripts
