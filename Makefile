# kvlab: `make run` starts the app, `make test` runs the test suite,
# `make test-fast` only its unit tier (no bundled model, no browser),
# `make test-slow` only the slow tier (builds and serves the Docker image, tests the newest releases in range).
# Every target installs what it needs first (scripts/setup.sh skips work
# already done) and uses .venv/bin/python directly.

PYTHON := .venv/bin/python
SETUP := bash scripts/setup.sh

.PHONY: setup setup-test run test test-fast test-slow bench clean

setup:
	$(SETUP)

setup-test:
	$(SETUP) --test

run: setup
	$(PYTHON) app.py

test: setup-test
	$(PYTHON) -m pytest -q -n 2 -m unit tests
	$(PYTHON) -m pytest -q --durations=60 -m 'not unit and not slow' tests

test-fast: setup-test
	$(PYTHON) -m pytest -q -m unit tests

test-slow: setup-test
	$(PYTHON) -m pytest -q -m slow tests

bench: setup-test
	$(PYTHON) -m benchmarks

clean:
	rm -rf .venv .pytest_cache artifacts build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
