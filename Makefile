# Two commands: `make demo` and `make test`. Both build .venv from nothing:
# torch first (pinned, so no newer CUDA build is pulled in), then kiln with its extras.
TORCH_VERSION ?= 2.13.0
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed-$(TORCH_VERSION)
PYTEST_WORKERS ?= 2
# redis-server (Debian package) for the shared-cache tests; root installs it, others through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_ARGS ?= --suite smoke --modes all --threads 2 --iters 10

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[test,bench]"
	rm -f $(VENV)/.kiln-installed-*
	touch $@

demo: setup
	$(VENV)/bin/kiln bench $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) -q tests

clean:
	rm -rf $(VENV) build *.egg-info
