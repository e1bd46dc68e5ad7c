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

# kiln's capture reads CPython bytecode, which differs from version to version: its tests (all
# but the HuggingFace model files) run again under CPython 3.13 where this machine has it (pyenv's,
# as on the CI machines), in a venv of its own with the same torch (from the registry for 3.13: a
# CUDA build, ~3 GB, used on the CPU; ~2 min with the install). `make test` runs them; a machine
# without 3.13 says so. 3.12 (closer to 3.11) is added on request, ~2 min more:
#   make test-pythons OTHER_PYTHONS="$$HOME/.pyenv/versions/3.12.1/bin/python3 $$HOME/.pyenv/versions/3.13.0/bin/python3"
OTHER_PYTHONS ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3))
VERSION_TESTS := tests/capture --ignore=tests/capture/test_hf_models.py -k "not hf_models"

.PHONY: setup demo test test-pythons clean

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
	$(MAKE) test-pythons

test-pythons:
	@test -n "$(OTHER_PYTHONS)" || echo "test-pythons: no CPython 3.13 under ~/.pyenv: the capture is tested on $$($(PY) --version) only"
	@set -e; for python in $(OTHER_PYTHONS); do \
		version=$$($$python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); venv=.venv-py$$version; \
		echo "test-pythons: Python $$version ($$venv)"; \
		test -x $$venv/bin/python || $$python -m venv $$venv; \
		$$venv/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)" "pytest>=8" "pytest-xdist>=3.5" expecttest "transformers>=4.50"; \
		$$venv/bin/python -m pip install --quiet --no-deps -e .; \
		$$venv/bin/python -m pytest -n $(PYTEST_WORKERS) -q -p no:cacheprovider $(VERSION_TESTS); \
	done

clean:
	rm -rf $(VENV) build *.egg-info
