# Snapflow developer commands. `make run` and `make test` are the two to know.
#
#   make install      create .venv and install the project with its dev extras (idempotent)
#   make test         run the test suite (first `make browser`)
#   make browser      install chromium and chromedriver (Debian packages) for the dashboard test
#   make run          run the demo job on local Spark: a task killed, recovered, checked exactly-once
#   make coordinator  run the coordinator service in the foreground (embedded Redis)
#   make proto        regenerate snapflow/v1 from protos/
#   make lint         ruff check, ruff format --check, mypy, deptry (every import declared)
#   make bench        run the benchmarks (BENCH=<name> selects one; BENCH=nexmark QUERIES=q0,q5)
#   make chaos        run the full chaos suite (SEED=<n> replays a run; docs/chaos.md)
#   make compose-check  docker compose up of docker-compose.yml until the demo says exactly-once: yes
#   make clean        remove caches and build artefacts (distclean also removes .venv)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Extra arguments for `make run` / `make coordinator`, e.g. make run ARGS='--records small'.
ARGS  ?=
# One benchmark by name; empty lets the bench package decide (all, or a list).
BENCH ?=
# The chaos suite's seed: the same seed replays the same plan of faults.
SEED  ?= 1

MIN_PYTHON := (3, 11)
CHECK_PYTHON = import sys; v = sys.version_info; \
	sys.exit(0 if v >= $(MIN_PYTHON) else \
	f"error: Snapflow needs Python >= 3.11, but {sys.executable} is {v.major}.{v.minor}.{v.micro}; \
	run make with PYTHON=/path/to/python3.11 (or newer)")

.DEFAULT_GOAL := help

.PHONY: help install browser test run coordinator proto lint bench chaos compose-check clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

install: $(STAMP)

# Re-installs only when pyproject.toml changed (or .venv was removed).
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
		echo "error: '$(PYTHON)' not found; install Python >= 3.11 or run make with PYTHON=/path/to/python3" >&2; \
		exit 1; }
	@$(PYTHON) -c '$(CHECK_PYTHON)'
	@if [ ! -x $(BIN)/python ]; then \
		echo "creating $(VENV) with $$($(PYTHON) -c 'import sys; print(sys.executable)')"; \
		$(PYTHON) -m venv $(VENV); \
	fi
	@$(BIN)/python -c '$(CHECK_PYTHON)' || { \
		echo "error: the existing $(VENV) uses an older Python; remove it (make distclean) and run make install again" >&2; \
		exit 1; }
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

# The dashboard's browser test drives Debian's chromium through chromedriver. Installed with
# apt-get when missing (as root, else with sudo when there is one); if that is not possible
# this only warns, and the test fails saying what to install.
CHROMIUM_BINARIES := /usr/bin/chromium /usr/bin/chromedriver
browser:
	@missing=0; for f in $(CHROMIUM_BINARIES); do [ -x $$f ] || missing=1; done; \
	if [ $$missing = 0 ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "warning: chromium/chromedriver missing and not root: run 'apt-get install -y chromium chromium-driver' as root" >&2; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "warning: chromium/chromedriver missing and no apt-get: install chromium and its chromedriver at $(CHROMIUM_BINARIES)" >&2; exit 0; fi; \
	echo "installing chromium and chromium-driver (Debian packages) for the dashboard test"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
		|| echo "warning: installing chromium failed; the dashboard test will fail" >&2

test: install browser
	$(BIN)/pytest -p no:cacheprovider tests/

run: install
	$(BIN)/snapflow demo $(ARGS)

coordinator: install
	$(BIN)/snapflow coordinator $(ARGS)

proto: install
	$(BIN)/python protos/generate.py

# Generated code (snapflow/v1) is excluded in pyproject.toml ([tool.ruff], [tool.mypy]).
# All three checks run; the target fails if any of them failed.
lint: install
	@status=0; \
	echo "$(BIN)/ruff check ."; $(BIN)/ruff check . || status=1; \
	echo "$(BIN)/ruff format --check ."; $(BIN)/ruff format --check . || status=1; \
	echo "$(BIN)/mypy"; $(BIN)/mypy || status=1; \
	echo "$(BIN)/deptry ."; $(BIN)/deptry . || status=1; \
	exit $$status

# tests/ on the path: the coordinator benchmark's simulated agents are the test kit's (not shipped).
bench: install
	PYTHONPATH=tests$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/python -m bench $(BENCH)

chaos: install
	$(BIN)/python -m chaos --seed $(SEED)

# The container cluster for real (Docker engine and Compose needed; docker/compose-check says
# what it does). Run it whenever the Dockerfile, the compose file or the dependencies change.
compose-check:
	docker/compose-check

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache spark-warehouse
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
