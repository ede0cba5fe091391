# The one entry point: `make run` starts a broker, `make test` runs every test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTHON ?= python3
STAMP  := $(VENV)/.installed
NODE_STAMP := tests/interop/node_modules/.installed
PORT   ?= 8765
VARDIR ?= var

.PHONY: install run test lint fmt check bench bench-peers clean node chromium

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,uvloop]'
	touch $@

# The npm fq client is the independent interop client for the wire tests.
node: $(NODE_STAMP)

$(NODE_STAMP): tests/interop/package.json
	cd tests/interop && npm install --no-audit --no-fund --loglevel=error
	touch $@

# Headless Chromium for tests/test_webui.py, which skips without it (needs root for apt-get).
chromium:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium </dev/null; }

run: install
	mkdir -p $(VARDIR)
	exec $(VENV)/bin/fqd -p $(PORT) -n 127.0.0.1 -c $(VARDIR)/fqd.sqlite -q $(VARDIR)/queues

test: install node
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff format --check fqbroker tests bench
	$(VENV)/bin/ruff check fqbroker tests bench
	$(VENV)/bin/mypy

fmt: install
	$(VENV)/bin/ruff format fqbroker tests bench
	$(VENV)/bin/ruff check --fix fqbroker tests bench

check: lint test

# The whole table, or some scenarios: make bench BENCH="1to1-100 latency" (see bench/__main__.py).
bench: install
	$(PY) -m bench $(BENCH)

# The peers the table compares against, from Debian's packages (needs root for apt-get);
# without them the table says "skipped: not installed".
bench-peers:
	command -v redis-server >/dev/null 2>&1 && command -v nats-server >/dev/null 2>&1 || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server nats-server </dev/null; }

clean:
	rm -rf $(VENV) var tests/interop/node_modules .pytest_cache .mypy_cache .ruff_cache
