# The two set-up commands of README.md: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aerie-installed
PYTEST_ARGS ?=

.PHONY: install lint test test-fast demo bench stack clean

# torch==2.13.0 first: on these machines that is the local CPU wheel; any other spec would pull
# gigabytes of CUDA wheels. The [train] extra pins the same version so nothing replaces it.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,train]'
	@$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '2.13.0' else f'torch {v} crept in; expected 2.13.0')"
	@# The browser tests (tests/browser) drive Debian's Chromium through Playwright's Python package.
	if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
		|| echo "could not install chromium (root needed): tests/browser will fail until it is there"; fi
	touch $(STAMP)

install: $(STAMP)

# Lint, format and import order (ruff) and types (mypy, strict where `[tool.mypy]` says) before any
# test: a violation fails `make test`, so CI enforces them.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The whole suite, slow tests included, in two phases (markers set in tests/conftest.py):
# 1. on two workers: the unit tests, and beside them the clean 10-minute run (`side_by_side`);
#    three workers were tried (the clean run mostly sleeps): no faster, the unit tests beside it use
#    both cores already (measured 2026-11-28: phase 1 is CPU-bound);
# 2. one at a time: the tests that run whole jobs on tight detection thresholds (`serial`).
# Both phases always run; pytest's exit 5 (no tests collected) is not a failure.
test: install lint
	@set +e; \
	$(PY) -m pytest -n 2 --dist loadgroup -m "not serial" $(PYTEST_ARGS); a=$$?; \
	$(PY) -m pytest -m serial $(PYTEST_ARGS); b=$$?; \
	for rc in $$a $$b; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: install
	$(PY) -m orchestrator.demo

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
