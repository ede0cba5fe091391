# The one entry point: `make run` starts a broker, `make test` runs every test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTHON ?= python3
STAMP  := $(VENV)/.installed
ACCEL_STAMP := $(VENV)/.accel
SPARK_STAMP := $(VENV)/.spark-installed
NODE_STAMP := tests/interop/node_modules/.installed
PORT   ?= 8765
VARDIR ?= var
LINTED := fqbroker tests bench pyspark_fqbroker examples/spark setup.py

.PHONY: install accel run test test-pure lint types fmt check bench bench-peers clean node chromium help
.PHONY: spark java
.PHONY: fuzz soak storm authstorm

install: $(STAMP) $(ACCEL_STAMP) ## make the virtualenv (.venv) and install fqbroker in it (the default goal)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,uvloop]'
	touch $@

# The compiled accelerator (fqbroker/accel.py, setup.py): the hot modules compiled in place
# with mypyc (the dev extra's), where a C compiler works; built again when one of them
# changes. A build that fails leaves pure Python and says why; FQBROKER_PURE=1 skips it.
# `python -c 'import fqbroker; print(fqbroker.ACCELERATED)'` or `fqd --version` says
# which runs.
ACCEL_SOURCES = $(shell $(PYTHON) -c 'import sys; sys.path.insert(0, "."); \
  from fqbroker.accel import MODULES, source_path; print(*map(source_path, MODULES))')

accel: $(ACCEL_STAMP) ## compile the hot modules with mypyc (pure Python where that fails)

$(ACCEL_STAMP): $(STAMP) setup.py fqbroker/accel.py $(ACCEL_SOURCES)
	@# pip install -e built it already when the sources are those it was built from.
	$(PY) -c 'import sys, fqbroker.accel as a; sys.exit(not a.ACCELERATED)' 2>/dev/null || \
	  $(PY) setup.py --quiet build_ext --inplace || echo "fqbroker accelerator: not built" >&2
	touch $@

# The spark extra (pyspark, pyarrow) for fqbroker.spark and tests/spark, and Java for Spark.
spark: $(SPARK_STAMP) java ## the spark extra (pyspark, pyarrow) and Java 17, for tests/spark

$(SPARK_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,uvloop,spark]'
	touch $@

# Java 17+ for Spark, with apt-get (root, as on CI). Without it tests/spark skip and say
# why; with CI set this target fails instead, and so would the tests (tests/prereqs.py).
java: ## Java 17 with apt-get (root), for Spark
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq openjdk-17-jre-headless </dev/null >/dev/null; } || \
	  { echo "Java 17 could not be installed; the Spark tests will be skipped" >&2; \
	    case "$${CI:-}" in ""|0|false|no) ;; *) exit 1;; esac; }

# The npm clients the interop tests drive (tests/interop/package.json): fq for the wire
# tests, lumberjack-protocol and lumberjack-client for the Lumberjack listener. The Python
# ones (pylogbeat, python-logstash-async, trustme) come with the dev extra in `install`.
node: $(NODE_STAMP) ## the npm clients the interop tests drive

$(NODE_STAMP): tests/interop/package.json
	cd tests/interop && npm install --no-audit --no-fund --loglevel=error
	touch $@

# Headless Chromium for tests/e2e/webui/test_webui.py (needs root for apt-get). Without it the test
# skips and says why, except with CI set, where it fails (tests/prereqs.py).
chromium: ## headless Chromium with apt-get (root), for the web UI tests
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium </dev/null; }

run: install ## start a broker: make run [PORT=8765] [VARDIR=var]
	mkdir -p $(VARDIR)
	exec $(VENV)/bin/fqd -p $(PORT) -n 127.0.0.1 -c $(VARDIR)/fqd.sqlite -q $(VARDIR)/queues

test: install spark node ## run every test
	$(PY) -m pytest -q

# The tests of the compiled modules again, in pure Python (`make test` runs them compiled
# where the accelerator is built; tests/test_accel.py compares the two): each module's
# tests sit where its path says, tests/<path>/test_<module>*.py.
ACCEL_TESTS = $(shell $(PYTHON) -c 'import sys, glob; sys.path.insert(0, "."); \
  from fqbroker.accel import MODULES; \
  print("tests/test_accel.py", *sorted({t for m in MODULES for t in glob.glob( \
    "tests/" + "/".join(m.split(".")[1:-1]) + "/test_" + m.split(".")[-1] + "*.py")}))')
test-pure: install ## the compiled modules' tests again, in pure Python
	FQBROKER_PURE=1 $(PY) -m pytest -q $(ACCEL_TESTS)

lint: install ## ruff format --check, ruff check and mypy
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy

types: install ## mypy
	$(VENV)/bin/mypy

fmt: install ## ruff format and ruff check --fix
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

# What CI runs (.ci/run): lint, types, every test (compiled where the accelerator is built)
# and the compiled modules' tests in pure Python. Each part runs even when one before
# it failed, so one run shows every problem; the target fails if any part did.
check: install ## what CI runs: lint, types, test, test-pure
	@failed=""; \
	$(VENV)/bin/ruff format --check $(LINTED) || failed="$$failed ruff-format"; \
	$(VENV)/bin/ruff check $(LINTED) || failed="$$failed ruff-check"; \
	$(VENV)/bin/mypy || failed="$$failed mypy"; \
	$(MAKE) --no-print-directory test || failed="$$failed test"; \
	$(MAKE) --no-print-directory test-pure || failed="$$failed test-pure"; \
	if [ -n "$$failed" ]; then echo "make check failed:$$failed" >&2; exit 1; fi

# The whole table, or some scenarios: make bench BENCH="1to1-100 latency" (see bench/__main__.py).
bench: install ## the bench table, or some rows: make bench BENCH="1to1-100 latency"
	$(PY) -m bench $(BENCH)

# The peers the table compares against, from Debian's packages (needs root for apt-get);
# without them the table says "skipped: not installed".
bench-peers: ## redis-server, nats-server and rabbitmq-server with apt-get (root), for the bench
	command -v redis-server >/dev/null 2>&1 && command -v nats-server >/dev/null 2>&1 && \
	  command -v rabbitmq-server >/dev/null 2>&1 || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server nats-server \
	    rabbitmq-server </dev/null; }

# The reliability suite (docs/reliability.md): each exits non-zero on a failed check.
# Options after the target's variable, e.g. make soak SOAK="--minutes 5"; broker settings
# pass through as --setting KEY=VALUE (TOML value) or --fqd-arg ARG.
fuzz: install ## the reliability suite's fuzzer: make fuzz FUZZ="..."
	$(PY) -m bench.fuzz $(FUZZ)

soak: install ## the soak test: make soak SOAK="--minutes 5"
	$(PY) -m bench.soak $(SOAK)

storm: install ## the connection storm: make storm STORM="..."
	$(PY) -m bench.storm $(STORM)

authstorm: install ## the login storm: make authstorm AUTHSTORM="..."
	$(PY) -m bench.authstorm $(AUTHSTORM)

# Every target with its `## ` text, one a line.
help: ## list the targets
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

clean: ## remove the virtualenv, var/, node_modules and build files
	rm -rf $(VENV) var tests/interop/node_modules .pytest_cache .mypy_cache .ruff_cache build
	find fqbroker -name '*.so' -delete; rm -f fqbroker/_compiled.json
