# Two commands: `make demo` and `make test`. Both build .venv from nothing:
# torch first (pinned, so no newer CUDA build is pulled in), then kiln with its extras.
TORCH_VERSION ?= 2.13.0
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed-$(TORCH_VERSION)
PYTEST_WORKERS ?= 2
# Debian packages the tests need, each installed when its command is missing (command:package in
# the rule): redis-server and openssl (the TLS certificates) for the shared-cache tests, the
# aarch64 cross compiler and qemu for the NEON tests (tests/codegen/test_neon_cross.py), chromium for the
# compile report's browser test (tests/trace/test_report.py). Root
# installs them, others through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_ARGS ?= --suite smoke --modes all --threads 2 --iters 10

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	missing=$$(for need in redis-server:redis-server openssl:openssl chromium:chromium aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64:qemu-user; do \
		command -v $${need%%:*} >/dev/null || echo $${need#*:}; done); \
	test -z "$$missing" || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing >/dev/null; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(VENV)/bin/kiln prebuild
	rm -f $(VENV)/.kiln-installed-*
	touch $@

demo: setup
	$(VENV)/bin/kiln bench $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) -q tests

clean:
	rm -rf $(VENV) build *.egg-info
