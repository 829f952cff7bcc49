# Two commands: `make demo` and `make test`. Each sets up everything it needs.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup sysdeps services clean bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# System packages and services the tests need: PostgreSQL, OpenSSH server, Chromium.
sysdeps:
	bash tests/sysdeps.sh

services: sysdeps
	bash tests/services.sh start

demo: setup
	$(BIN)/tuneloop demo

test: setup services
	. ./.tuneloop-test-env && CI=$${CI:-} $(BIN)/python -m pytest -q -p no:cacheprovider

bench: setup
	$(BIN)/python bench/sim_speed.py

clean:
	rm -rf $(VENV) .tuneloop-test-env
